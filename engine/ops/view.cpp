// reshape, view and broadcast_to: new shapes over the same storage.
#include <optional>

#include "ops/sum_to.h"
#include "core/registry.h"
#include "core/tensor/copy.h"

namespace kiln {

namespace {

// Strides that let `shape` view a tensor of (old_shape, old_strides) without a copy, or
// nothing when the layout does not allow it (PyTorch's computeStride).
std::optional<Shape> view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& shape) {
  if (shape_numel(old_shape) == 0) return contiguous_strides(shape);
  if (old_shape.empty()) return Shape(shape.size(), 1);
  Shape strides(shape.size());
  std::int64_t view_d = static_cast<std::int64_t>(shape.size()) - 1;
  std::int64_t chunk_stride = old_strides.back(), tensor_numel = 1, view_numel = 1;
  for (std::int64_t d = static_cast<std::int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    // A chunk ends where the previous dim does not continue this one in memory.
    if (d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_stride = old_strides[d - 1];
        tensor_numel = view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return strides;
}

// Resolves one -1 and checks the element count.
Shape infer_shape(const Shape& shape, std::int64_t numel, std::string_view op) {
  Shape out = shape;
  int infer = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      if (infer >= 0) throw ShapeError("[" + std::string(op) + "] shape " + shape_str(shape) + " has more than one -1");
      infer = static_cast<int>(i);
    } else if (out[i] < 0) {
      throw ShapeError("[" + std::string(op) + "] shape " + shape_str(shape) + " has a negative size");
    } else {
      known *= out[i];
    }
  }
  if (infer >= 0 && known != 0 && numel % known == 0) out[static_cast<std::size_t>(infer)] = numel / known;
  if (shape_numel(out) != numel || (infer >= 0 && known == 0))
    throw ShapeError("[" + std::string(op) + "] shape " + shape_str(shape) + " is invalid for a tensor of " +
                     std::to_string(numel) + " elements");
  return out;
}

const Shape& target(const OpArgs& a) { return a.attrs.get<std::vector<std::int64_t>>("shape"); }

std::vector<Tensor> reshape_back(const VjpContext& c, std::span<const Tensor> g) {
  return {reshape(g[0], c.input(0).shape)};
}

OpDef view_like(std::string name, bool may_copy) {
  Impl impl = [may_copy](const OpArgs& a, std::span<Tensor> out) {
    const Tensor& in = a.inputs[0];
    const Shape shape = infer_shape(target(a), in.numel(), a.op.name);
    if (auto strides = view_strides(in.shape(), in.strides(), shape)) {
      out[0] = make_view(in, shape, *strides, in.offset());
    } else if (may_copy) {
      Tensor c = convert(in, in.dtype());
      out[0] = make_view(c, shape, contiguous_strides(shape), 0);
    } else {
      throw ShapeError("[view] a tensor of shape " + shape_str(in.shape()) + " and strides " + shape_str(in.strides()) +
                       " cannot be viewed as " + shape_str(shape) + "; use reshape (which copies)");
    }
  };
  return OpDef{
      .name = std::move(name),
      .dtype_rule = rules::same_as_input,
      .shape_rule = [](const OpArgs& a) { return std::vector<Shape>{infer_shape(target(a), a.inputs[0].numel(), a.op.name)}; },
      .cpu = impl,
      .gpu = impl,
      .makes_outputs = true,
      .vjp = reshape_back,
      .test = {.attrs = {Attrs{{"shape", std::vector<std::int64_t>{-1}}}}},
  };
}

const OpDef& kReshape = register_op(view_like("reshape", true));
const OpDef& kView = register_op(view_like("view", false));

const OpDef& kBroadcastTo = register_op({
    .name = "broadcast_to",
    .dtype_rule = rules::same_as_input,
    .shape_rule =
        [](const OpArgs& a) {
          const Shape& in = a.inputs[0].shape();
          if (in.size() > target(a).size() || broadcast_shapes(in, target(a), a.op.name) != target(a))
            throw ShapeError("[broadcast_to] cannot broadcast shape " + shape_str(in) + " to " + shape_str(target(a)));
          return std::vector<Shape>{target(a)};
        },
    .cpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          const Tensor& in = a.inputs[0];
          out[0] = make_view(in, target(a), cpu::broadcast_strides(in.shape(), in.strides(), target(a)), in.offset());
        },
    .gpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          const Tensor& in = a.inputs[0];
          out[0] = make_view(in, target(a), cpu::broadcast_strides(in.shape(), in.strides(), target(a)), in.offset());
        },
    .makes_outputs = true,
    .vjp = [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
      return {sum_to(g[0], c.input(0).shape)};
    },
    .test = {.attrs = {Attrs{{"shape", std::vector<std::int64_t>{3, 1}}}}},
});

Attrs shape_attrs(const Shape& s) { return Attrs{{"shape", std::vector<std::int64_t>(s)}}; }

}  // namespace

Tensor reshape(const Tensor& a, const Shape& shape) {
  return call(kReshape, {a}, shape_attrs(infer_shape(shape, a.numel(), "reshape")));
}
Tensor view(const Tensor& a, const Shape& shape) {
  return call(kView, {a}, shape_attrs(infer_shape(shape, a.numel(), "view")));
}
Tensor broadcast_to(const Tensor& a, const Shape& shape) { return call(kBroadcastTo, {a}, shape_attrs(shape)); }

}  // namespace kiln
