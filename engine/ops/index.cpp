// gather, index_select, scatter_add and one_hot. Indices arrive as i64 (i32 is cast by the
// dtype rule). The CPU reference checks every index (ValueError); the GPU kernels
// (kernel_templates/index.cu) cannot without a host sync, so there an out-of-range index
// reads 0 (gather), is dropped (scatter_add) or gives a zero row (one_hot).
#include "core/registry.h"
#include "core/step/step_state.h"
#include "core/tensor/copy.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/shape_ops.h"

namespace kiln {

namespace {

using Ints = std::vector<std::int64_t>;

// Mirrors ki::IndexLayout in kernel_templates/index.cu (field order and sizes).
struct IndexLayout {
  std::int64_t n = 0;
  std::int32_t ndim = 0;
  std::int32_t dim = 0;
  std::int64_t dim_size = 0;
  std::int64_t size[kernels::kMaxDims] = {};
  std::int64_t a_stride[kernels::kMaxDims] = {};
  std::int64_t idx_stride[kernels::kMaxDims] = {};
  std::int64_t b_stride[kernels::kMaxDims] = {};
};

// Iteration over `index`'s shape; `a` is indexed along `axis`, `b` (optional) walks with the index.
IndexLayout index_layout(const Tensor& a, const Tensor& index, const Tensor* b, int axis, std::string_view op) {
  if (index.dim() > kernels::kMaxDims)
    throw ShapeError("[" + std::string(op) + "] GPU kernels take at most 8 dims; got shape " +
                     shape_str(index.shape()));
  IndexLayout L;
  L.n = index.numel();
  L.ndim = index.dim();
  L.dim = axis;
  L.dim_size = a.shape()[static_cast<std::size_t>(axis)];
  for (int d = 0; d < index.dim(); ++d) {
    L.size[d] = index.shape()[d];
    L.a_stride[d] = a.strides()[d];
    L.idx_stride[d] = index.strides()[d];
    if (b) L.b_stride[d] = b->strides()[d];
  }
  return L;
}

rt::Function function(const gpu::LazyKernel& k, DType t, Device d) {
  return rt::get_function(k.get(), {t}, 0, d.index());
}

// Index ops address elements along a real dim, so a 0-d input is rejected up front.
int axis_of(const OpArgs& a) {
  if (a.inputs[0].dim() == 0) throw ShapeError("[" + a.op.name + "] input must have at least 1 dim, got a 0-d tensor");
  return normalize_axis(a.attrs.get<std::int64_t>("axis"), a.inputs[0].dim(), a.op.name);
}

void check_index_dtype(const Tensor& index, std::string_view op) {
  if (index.dtype() != DType::i64 && index.dtype() != DType::i32)
    throw DTypeError("[" + std::string(op) + "] index must be i64 or i32, got " +
                     std::string(dtype_name(index.dtype())));
}

[[noreturn]] void out_of_range(std::string_view op, std::int64_t k, int axis, const Shape& shape) {
  throw ValueError("[" + std::string(op) + "] index " + std::to_string(k) + " is out of range for dim " +
                   std::to_string(axis) + " of shape " + shape_str(shape));
}

// out[c] = in[c with c[axis] = index[c]] over index's shape (which is out's shape).
void gather_cpu(const Tensor& in, const Tensor& index, const Tensor& out, int axis, std::string_view op) {
  Shape in_strides = in.strides();
  const std::int64_t step = in_strides[static_cast<std::size_t>(axis)], n = in.shape()[static_cast<std::size_t>(axis)];
  in_strides[static_cast<std::size_t>(axis)] = 0;
  const auto* pi = cpu::ptr<const std::int64_t>(index);
  cpu::visit(in.dtype(), [&]<class T>() {
    const T* src = cpu::ptr<const T>(in);
    T* dst = cpu::ptr<T>(out);
    cpu::for_each_offset<3>(index.shape(), {&out.strides(), &index.strides(), &in_strides}, {0, 0, 0},
                            [&](const std::array<std::int64_t, 3>& o) {
                              const std::int64_t k = pi[o[1]];
                              if (k < 0 || k >= n) out_of_range(op, k, axis, in.shape());
                              dst[o[0]] = src[o[2] + k * step];
                            });
  });
}

void gather_gpu(const gpu::LazyKernel& k, const Tensor& in, const Tensor& index, const Tensor& out, int axis,
                std::string_view op) {
  if (out.numel() == 0) return;
  const IndexLayout L = index_layout(in, index, nullptr, axis, op);
  const rt::Stream& s = stream_of(out.device());
  rt::launch(function(k, in.dtype(), out.device()), kernels::grid_stride_config(L.n, s.device()), s, device_address(in),
             device_address(index), device_address(out), L);
}

DTypePlan index_plan(const OpArgs& a) {
  check_index_dtype(a.inputs[1], a.op.name);
  const DType t = a.inputs[0].dtype();
  return DTypePlan{{t, DType::i64}, {t}, t};
}

// index_select's index as a view over the output's shape: stride 0 except along axis.
Tensor select_index(const Tensor& index, const Shape& out_shape, int axis) {
  Shape strides(out_shape.size(), 0);
  strides[static_cast<std::size_t>(axis)] = index.dim() == 0 ? 0 : index.strides()[0];
  return make_view(index, out_shape, strides, index.offset());
}

const gpu::LazyKernel kGatherKernel("gather");

const OpRef kGather = register_op({
    .name = "gather",
    .num_inputs = 2,
    .dtype_rule = index_plan,
    .shape_rule =
        [](const OpArgs& a) {
          const Tensor &in = a.inputs[0], &idx = a.inputs[1];
          const int axis = axis_of(a);
          bool ok = idx.dim() == in.dim();
          for (int d = 0; ok && d < in.dim(); ++d) ok = d == axis || idx.shape()[d] <= in.shape()[d];
          if (!ok)
            throw ShapeError("[gather] index of shape " + shape_str(idx.shape()) + " does not fit input of shape " +
                             shape_str(in.shape()) + " along dim " + std::to_string(axis));
          return std::vector<Shape>{idx.shape()};
        },
    .cpu = [](const OpArgs& a,
              std::span<Tensor> out) { gather_cpu(a.inputs[0], a.inputs[1], out[0], axis_of(a), "gather"); },
    .gpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          gather_gpu(kGatherKernel, a.inputs[0], a.inputs[1], out[0], axis_of(a), "gather");
        },
    .vjp = [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
      const std::int64_t axis = c.attrs().get<std::int64_t>("axis");
      Tensor zero = zeros(c.input(0).shape, {.dtype = g[0].dtype(), .device = g[0].device()});
      return {scatter_add(zero, axis, c.saved_input(1), g[0]), Tensor()};
    },
    .save = {.inputs = {1}},
    // Random float inputs cannot be indices: tests/engine/test_shape_ops.cpp checks gradients.
    .test = {.attrs = {Attrs{{"axis", std::int64_t{0}}}}, .gradcheck = false},
});

const OpRef kIndexSelect = register_op({
    .name = "index_select",
    .num_inputs = 2,
    .dtype_rule = index_plan,
    .shape_rule =
        [](const OpArgs& a) {
          const Tensor &in = a.inputs[0], &idx = a.inputs[1];
          if (idx.dim() > 1) throw ShapeError("[index_select] index must be 1-d, got shape " + shape_str(idx.shape()));
          Shape out = in.shape();
          out[static_cast<std::size_t>(axis_of(a))] = idx.numel();
          return std::vector<Shape>{out};
        },
    .cpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          const int axis = axis_of(a);
          gather_cpu(a.inputs[0], select_index(a.inputs[1], out[0].shape(), axis), out[0], axis, "index_select");
        },
    .gpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          const int axis = axis_of(a);
          gather_gpu(kGatherKernel, a.inputs[0], select_index(a.inputs[1], out[0].shape(), axis), out[0], axis,
                     "index_select");
        },
    // index_add: the gradient rows scatter-added back to the rows they came from.
    .vjp = [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
      const Shape& in = c.input(0).shape;
      const int axis = normalize_axis(c.attrs().get<std::int64_t>("axis"), static_cast<int>(in.size()), c.name());
      Shape along(in.size(), 1);
      along[static_cast<std::size_t>(axis)] = g[0].shape()[static_cast<std::size_t>(axis)];
      Tensor idx = broadcast_to(reshape(c.saved_input(1), along), g[0].shape());
      Tensor zero = zeros(in, {.dtype = g[0].dtype(), .device = g[0].device()});
      return {scatter_add(zero, axis, idx, g[0]), Tensor()};
    },
    .save = {.inputs = {1}},
    .test = {.attrs = {Attrs{{"axis", std::int64_t{0}}}}, .gradcheck = false},
});

// The CPU accumulator: f32 for f16/bf16 (as the GPU's scratch), the storage type otherwise.
template <class T>
using ScatterAcc = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;

void scatter_add_cpu(const OpArgs& a, const Tensor& out) {
  const Tensor &self = a.inputs[0], &index = a.inputs[1], &src = a.inputs[2];
  const int axis = axis_of(a);
  const std::int64_t n = self.shape()[static_cast<std::size_t>(axis)];
  // out is contiguous; acc mirrors it, and the index walks acc with the axis stride zeroed.
  Shape acc_strides = out.strides();
  const std::int64_t step = acc_strides[static_cast<std::size_t>(axis)];
  acc_strides[static_cast<std::size_t>(axis)] = 0;
  const auto* pi = cpu::ptr<const std::int64_t>(index);
  cpu::visit(out.dtype(), [&]<class T>() {
    using Acc = ScatterAcc<T>;
    if constexpr (std::is_same_v<T, bool>) {
      throw DTypeError("[scatter_add] bool is not supported");  // the dtype check rejects it first
    } else {
      copy_into(self, out);
      T* po = cpu::ptr<T>(out);
      std::vector<Acc> acc(static_cast<std::size_t>(out.numel()));
      for (std::size_t i = 0; i < acc.size(); ++i) acc[i] = static_cast<Acc>(cpu::load(po[i]));
      const T* ps = cpu::ptr<const T>(src);
      cpu::for_each_offset<3>(index.shape(), {&index.strides(), &src.strides(), &acc_strides}, {0, 0, 0},
                              [&](const std::array<std::int64_t, 3>& o) {
                                const std::int64_t k = pi[o[0]];
                                if (k < 0 || k >= n) out_of_range("scatter_add", k, axis, self.shape());
                                acc[static_cast<std::size_t>(o[2] + k * step)] += static_cast<Acc>(cpu::load(ps[o[1]]));
                              });
      for (std::size_t i = 0; i < acc.size(); ++i) po[i] = cpu::store<T>(acc[i]);
    }
  });
}

void scatter_add_gpu(const gpu::LazyKernel& k, const OpArgs& a, const Tensor& out) {
  const Tensor &self = a.inputs[0], &index = a.inputs[1], &src = a.inputs[2];
  const bool half = out.dtype() == DType::f16 || out.dtype() == DType::bf16;
  // f16/bf16 have no fast atomics of their own here: accumulate in f32, then cast once.
  Tensor acc = half ? empty(out.shape(), {.dtype = DType::f32, .device = out.device()}) : out;
  copy_into(self, acc);
  if (index.numel() > 0) {
    const IndexLayout L = index_layout(acc, index, &src, axis_of(a), "scatter_add");
    const rt::Stream& s = stream_of(out.device());
    rt::launch(function(k, out.dtype(), out.device()), kernels::grid_stride_config(L.n, s.device()), s,
               device_address(src), device_address(index), device_address(acc), L);
  }
  if (half) copy_into(acc, out);
}

const OpRef kScatterAdd = register_op({
    .name = "scatter_add",
    .num_inputs = 3,
    .dtypes = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64},
    .dtype_rule =
        [](const OpArgs& a) {
          check_index_dtype(a.inputs[1], a.op.name);
          const DType t = promote_types(a.inputs[0].dtype(), a.inputs[2].dtype());
          return DTypePlan{{t, DType::i64, t}, {t}, t};
        },
    .shape_rule =
        [](const OpArgs& a) {
          const Tensor &self = a.inputs[0], &idx = a.inputs[1], &src = a.inputs[2];
          const int axis = axis_of(a);
          bool ok = idx.dim() == self.dim() && src.dim() == self.dim();
          for (int d = 0; ok && d < self.dim(); ++d)
            ok = idx.shape()[d] <= src.shape()[d] && (d == axis || idx.shape()[d] <= self.shape()[d]);
          if (!ok)
            throw ShapeError("[scatter_add] index of shape " + shape_str(idx.shape()) + " does not fit self of shape " +
                             shape_str(self.shape()) + " and src of shape " + shape_str(src.shape()) + " along dim " +
                             std::to_string(axis));
          return std::vector<Shape>{self.shape()};
        },
    .cpu = [](const OpArgs& a, std::span<Tensor> out) { scatter_add_cpu(a, out[0]); },
    .gpu = [k = gpu::LazyKernel("scatter_add")](const OpArgs& a,
                                                std::span<Tensor> out) { scatter_add_gpu(k, a, out[0]); },
    // src's gradient is g at the scattered positions, zero where src has no index.
    .vjp = [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
      Tensor gs;
      if (c.needs_grad(2)) {
        gs = gather(g[0], c.attrs().get<std::int64_t>("axis"), c.saved_input(1));
        const Shape& src = c.input(2).shape;
        Ints pads;
        for (std::size_t d = src.size(); d-- > 0;) {
          pads.push_back(0);
          pads.push_back(src[d] - gs.shape()[d]);
        }
        if (gs.shape() != src) gs = pad(gs, pads);
      }
      return {g[0], Tensor(), gs};
    },
    .save = {.inputs = {1}},
    .test = {.attrs = {Attrs{{"axis", std::int64_t{0}}}}, .gradcheck = false},
});

const OpRef kOneHot = register_op({
    .name = "one_hot",
    .dtypes = {DType::i64},
    .dtype_rule =
        [](const OpArgs& a) {
          check_index_dtype(a.inputs[0], a.op.name);
          return DTypePlan{{DType::i64}, {DType::i64}, DType::i64};
        },
    .shape_rule =
        [](const OpArgs& a) {
          const std::int64_t c = a.attrs.get<std::int64_t>("num_classes");
          if (c <= 0) throw ValueError("[one_hot] num_classes must be positive, got " + std::to_string(c));
          Shape out = a.inputs[0].shape();
          out.push_back(c);
          return std::vector<Shape>{out};
        },
    .cpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          const Tensor& index = a.inputs[0];
          const std::int64_t c = a.attrs.get<std::int64_t>("num_classes");
          auto* po = cpu::ptr<std::int64_t>(out[0]);
          std::fill(po, po + out[0].numel(), 0);
          const auto* pi = cpu::ptr<const std::int64_t>(index);
          std::int64_t row = 0;
          cpu::for_each_offset<1>(index.shape(), {&index.strides()}, {0}, [&](const std::array<std::int64_t, 1>& o) {
            const std::int64_t k = pi[o[0]];
            if (k < 0 || k >= c) out_of_range("one_hot", k, index.dim(), out[0].shape());
            po[row++ * c + k] = 1;
          });
        },
    .gpu =
        [k = gpu::LazyKernel("one_hot")](const OpArgs& a, std::span<Tensor> out) {
          const std::int64_t n = out[0].numel(), c = a.attrs.get<std::int64_t>("num_classes");
          if (n == 0) return;
          Tensor index = a.inputs[0].is_contiguous() ? a.inputs[0] : convert(a.inputs[0], DType::i64);
          const rt::Stream& s = stream_of(out[0].device());
          rt::launch(function(k, DType::i64, out[0].device()), kernels::grid_stride_config(n, s.device()), s,
                     device_address(index), device_address(out[0]), n, c);
        },
    // Inputs in [0, 4): valid classes, so the GPU (which cannot check) is compared on real work.
    .test = {.attrs = {Attrs{{"num_classes", std::int64_t{4}}}}, .low = 0, .high = 4, .gradcheck = false},
});

}  // namespace

Tensor gather(const Tensor& input, std::int64_t dim, const Tensor& index) {
  return call(kGather, {input, index}, Attrs{{"axis", dim}});
}

Tensor index_select(const Tensor& input, std::int64_t dim, const Tensor& index) {
  // A compiled step's rows gathered by its input (a batch of a dataset on the device): the
  // graph's input copy gathers them.
  if (dim == 0)
    if (std::optional<Tensor> gathered = step::input_gather(input, index)) return *gathered;
  return call(kIndexSelect, {input, index}, Attrs{{"axis", dim}});
}

Tensor scatter_add(const Tensor& self, std::int64_t dim, const Tensor& index, const Tensor& src) {
  return call(kScatterAdd, {self, index, src}, Attrs{{"axis", dim}});
}

Tensor one_hot(const Tensor& index, std::int64_t num_classes) {
  return call(kOneHot, {index}, Attrs{{"num_classes", num_classes}});
}

}  // namespace kiln
