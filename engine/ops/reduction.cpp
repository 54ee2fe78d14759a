// sum, mean, prod (and exclusive_prod, its gradient) over any set of axes, and what every reduction shares
// (reduction_common.h). CPU: pairwise sums in f32 (f16/bf16/f32), f64 or i64 (integers,
// bool); GPU: the parallel reduction kernels of reduce_kernels.h.
#include <algorithm>
#include <string>

#include "core/dtype_sets.h"
#include "kiln/shape_ops.h"

#include "backend/cuda/reduce_kernels.h"
#include "reduction_common.h"
#include "backend/cuda/softmax_kernels.h"

namespace kiln {

namespace reduction {

std::vector<int> axes_of(const Attrs& attrs, const Shape& shape, std::string_view op) {
  const int nd = static_cast<int>(shape.size());
  if (!attrs.has("axes")) {
    std::vector<int> all(static_cast<std::size_t>(nd));
    for (int d = 0; d < nd; ++d) all[static_cast<std::size_t>(d)] = d;
    return all;
  }
  const auto& axes = attrs.get<std::vector<std::int64_t>>("axes");
  const std::int64_t n = std::max(nd, 1);  // a zero-dim tensor takes axis 0 or -1, as in PyTorch
  for (std::int64_t ax : axes)
    if (ax < -n || ax >= n)
      throw ShapeError("[" + std::string(op) + "] axis " + std::to_string(ax) + " is out of range for shape " +
                       shape_str(shape));
  return normalize_axes(axes, nd, op);
}

std::int64_t reduced_count(const Shape& in, const std::vector<int>& axes) {
  std::int64_t n = 1;
  for (int ax : axes) n *= in[static_cast<std::size_t>(ax)];
  return n;
}

std::vector<Shape> shape_rule(const OpArgs& a, bool needs_nonempty) {
  const Shape& in = a.inputs[0].shape();
  const auto axes = axes_of(a);
  if (needs_nonempty)
    for (int ax : axes)
      if (in[static_cast<std::size_t>(ax)] == 0)
        throw ValueError("[" + a.name() + "] cannot reduce over the empty axis " + std::to_string(ax) + " of shape " +
                         shape_str(in) + ": the op has no identity");
  return {reduced_shape(in, axes, keepdim_of(a.attrs))};
}

void gpu_reduce(const rt::KernelSpec& spec, const OpArgs& a, const Tensor& out, double param) {
  const Tensor& in = a.inputs[0];
  if (out.numel() == 0) return;  // nothing to write (and [outer, r, inner] would misread r)
  // An empty reduced dim: the kernel writes the identity (or NaN) and reads no input, so
  // no gather of the empty input is needed.
  if (in.numel() == 0) {
    kernels::launch_reduce(spec, in.dtype(), out.dtype(), device_address(in), device_address(out), out.numel(), 0, 1,
                           stream_of(in.device()), param);
    return;
  }
  gpu::reduce(spec, in, axes_of(a), out, param);
}

double correction_of(const Attrs& attrs) {
  if (!attrs.has("correction")) return 1.0;
  for (const auto& [k, v] : attrs.items())
    if (k == "correction" && std::holds_alternative<std::int64_t>(v)) return static_cast<double>(std::get<std::int64_t>(v));
  return attrs.get<double>("correction");
}

Tensor expand_back(const Tensor& t, const VjpContext& c) {
  const Shape& in = c.input(0).shape;
  const auto axes = axes_of(c.attrs(), in, c.name());
  return broadcast_to(reshape(t, reduced_shape(in, axes, true)), in);
}

std::vector<std::int64_t> axes_i64(const VjpContext& c) {
  const auto axes = axes_of(c.attrs(), c.input(0).shape, c.name());
  return {axes.begin(), axes.end()};
}

Tensor run_op(std::string_view name, std::initializer_list<Tensor> inputs) { return call(get_op(name), inputs); }

std::vector<Attrs> test_attrs() {
  using Axes = std::vector<std::int64_t>;
  return {Attrs{{"axes", Axes{0}}}, Attrs{{"axes", Axes{-1}}, {"keepdim", true}},
          Attrs{{"axes", Axes{0, 2}}, {"keepdim", false}}, Attrs{{"axes", Axes{0, 2, 3}}, {"keepdim", true}}, Attrs{}};
}

}  // namespace reduction

namespace {

using namespace reduction;

template <class T>
using WideOut = std::conditional_t<std::is_floating_point_v<cpu::compute_t<T>>, T, std::int64_t>;

// Floating inputs keep their dtype; integers and bool widen to i64.
DTypePlan widening(const OpArgs& a) {
  const DType in = a.inputs[0].dtype();
  return DTypePlan{{in}, {is_floating(in) ? in : DType::i64}, in};
}

const OpRef kSum = register_op({
    .name = "sum",
    .dtypes = {kAllDTypes.begin(), kAllDTypes.end()},
    .dtype_rule = widening,
    .shape_rule = [](const OpArgs& a) { return shape_rule(a, false); },
    .cpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          cpu_reduce<WideAcc>(a.inputs[0], axes_of(a), out[0],
                              [](auto v) { return cpu::pairwise_sum(v.data(), static_cast<std::int64_t>(v.size())); });
        },
    .gpu = [k = gpu::LazyKernel("sum")](const OpArgs& a, std::span<Tensor> out) { gpu_reduce(k.get(), a, out[0]); },
    // The gradient spreads back over the summed axes: a broadcast view of g.
    .vjp = [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> { return {expand_back(g[0], c)}; },
    .test = {.attrs = test_attrs()},
});

const OpRef kMean = register_op({
    .name = "mean",
    .dtypes = dtype_sets::floating,
    .dtype_rule = rules::promote_float,
    .shape_rule = [](const OpArgs& a) { return shape_rule(a, false); },
    .cpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          // Empty: 0 / 0 is NaN, as in PyTorch.
          cpu_reduce<WideAcc>(a.inputs[0], axes_of(a), out[0], [](auto v) {
            using A = typename decltype(v)::value_type;
            const auto n = static_cast<std::int64_t>(v.size());
            return cpu::pairwise_sum(v.data(), n) / static_cast<A>(n);
          });
        },
    .gpu = [k = gpu::LazyKernel("mean")](const OpArgs& a, std::span<Tensor> out) { gpu_reduce(k.get(), a, out[0]); },
    .vjp =
        [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
          const Shape& in = c.input(0).shape;
          const auto n = reduced_count(in, axes_of(c.attrs(), in, c.name()));
          return {expand_back(g[0], c) / static_cast<double>(n)};
        },
    .test = {.attrs = test_attrs()},
});

const OpRef kProd = register_op({
    .name = "prod",
    .dtypes = {kAllDTypes.begin(), kAllDTypes.end()},
    .dtype_rule = widening,
    .shape_rule = [](const OpArgs& a) { return shape_rule(a, false); },
    .cpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          cpu_reduce<WideAcc>(a.inputs[0], axes_of(a), out[0], [](auto v) {
            using A = typename decltype(v)::value_type;
            if constexpr (std::is_integral_v<A>) {
              std::uint64_t p = 1;  // integer products wrap, as in PyTorch (and without UB)
              for (A x : v) p *= static_cast<std::uint64_t>(x);
              return static_cast<A>(p);
            } else {
              A p = A(1);
              for (A x : v) p *= x;
              return p;
            }
          });
        },
    .gpu = [k = gpu::LazyKernel("prod")](const OpArgs& a, std::span<Tensor> out) { gpu_reduce(k.get(), a, out[0]); },
    // d prod / d x_i is the product of the other elements, taken as prefix x suffix over
    // the reduced elements (never y / x_i, which fails at zeros, overflow and inf / inf).
    // In f64: a partial product may overflow f32 where the gradient itself does not.
    .vjp =
        [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
          const Tensor x = c.saved_input(0);
          const auto axes = axes_of(c.attrs(), x.shape(), c.name());
          std::vector<std::int64_t> order, inverse(x.shape().size());
          for (int d = 0; d < x.dim(); ++d)
            if (std::find(axes.begin(), axes.end(), d) == axes.end()) order.push_back(d);
          order.insert(order.end(), axes.begin(), axes.end());
          for (std::size_t i = 0; i < order.size(); ++i) inverse[static_cast<std::size_t>(order[i])] = static_cast<std::int64_t>(i);
          const Tensor moved = permute(cast(x, DType::f64), order);  // reduced dims last
          const Shape moved_shape = moved.shape();
          const Tensor rows = reshape(moved, {x.numel() / std::max<std::int64_t>(reduced_count(x.shape(), axes), 1),
                                              reduced_count(x.shape(), axes)});
          const Tensor others = call(get_op("exclusive_prod"), {rows});
          const Tensor d = permute(reshape(cast(others, x.dtype()), moved_shape), inverse);
          return {expand_back(g[0], c) * d};
        },
    .save = {.inputs = {0}},
    .test = {.attrs = test_attrs(), .low = 0.5, .high = 1.5},
});

// out[..., k] = the product of x[..., j] over j != k along the last axis (prod's gradient):
// prefix times suffix, so a zero, an infinity or a NaN elsewhere needs no special case.
const OpRef kExclusiveProd = register_op({
    .name = "exclusive_prod",
    .dtypes = dtype_sets::floating,
    .dtype_rule = rules::promote_float,
    .shape_rule = rules::same_shape_as_input,
    .cpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          const Tensor x = a.inputs[0].contiguous();
          const std::int64_t n = x.dim() == 0 ? 1 : x.shape().back();
          if (x.numel() == 0) return;
          cpu::visit(x.dtype(), [&]<class T>() {
            if constexpr (std::is_floating_point_v<cpu::compute_t<T>>) {
              const T* px = cpu::ptr<const T>(x);
              T* po = cpu::ptr<T>(out[0]);
              std::vector<double> suffix(static_cast<std::size_t>(n) + 1);
              for (std::int64_t r = 0; r < x.numel() / n; ++r, px += n, po += n) {
                suffix[static_cast<std::size_t>(n)] = 1.0;
                for (std::int64_t k = n - 1; k >= 0; --k)
                  suffix[static_cast<std::size_t>(k)] = suffix[static_cast<std::size_t>(k) + 1] * cpu::load(px[k]);
                double prefix = 1.0;
                for (std::int64_t k = 0; k < n; ++k) {
                  po[k] = cpu::store<T>(prefix * suffix[static_cast<std::size_t>(k) + 1]);
                  prefix *= cpu::load(px[k]);
                }
              }
            }
          });
        },
    .gpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          const Tensor x = a.inputs[0].contiguous();
          const std::int64_t n = x.dim() == 0 ? 1 : x.shape().back();
          if (x.numel() == 0) return;
          kernels::launch_exclusive_prod(x.dtype(), device_address(x), device_address(out[0]), x.numel() / n, n,
                                         stream_of(a.device));
        },
    .test = {.low = 0.5, .high = 1.5, .gradcheck = false},
});

}  // namespace

std::vector<std::int64_t> all_axes(const Tensor& a) {
  std::vector<std::int64_t> all(static_cast<std::size_t>(a.dim()));
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::int64_t>(i);
  return all;
}

Tensor sum(const Tensor& a, const std::vector<std::int64_t>& axes, bool keepdim) {
  return call(kSum, {a}, Attrs{{"axes", axes}, {"keepdim", keepdim}});
}
Tensor sum(const Tensor& a) { return sum(a, all_axes(a), false); }

Tensor mean(const Tensor& a, const std::vector<std::int64_t>& axes, bool keepdim) {
  return call(kMean, {a}, Attrs{{"axes", axes}, {"keepdim", keepdim}});
}
Tensor mean(const Tensor& a) { return mean(a, all_axes(a), false); }

Tensor prod(const Tensor& a, const std::vector<std::int64_t>& axes, bool keepdim) {
  return call(kProd, {a}, Attrs{{"axes", axes}, {"keepdim", keepdim}});
}
Tensor prod(const Tensor& a) { return prod(a, all_axes(a), false); }

}  // namespace kiln
