// sum over any set of axes, keepdim or not. CPU: pairwise sums in f32 (f16/bf16/f32),
// f64 or i64 (integers, bool); GPU: the parallel reduction kernel "sum".
#include "../../ops/registry.h"

namespace kiln {

namespace {

std::vector<int> axes_of(const OpArgs& a) { return reduction_axes(a.attrs, a.inputs[0].dim(), a.op.name); }

template <class T>
using SumAcc = std::conditional_t<std::is_same_v<T, double>, double,
                                  std::conditional_t<std::is_floating_point_v<cpu::compute_t<T>>, float, std::int64_t>>;

const OpDef& kSum = register_op({
    .name = "sum",
    .dtypes = {kAllDTypes.begin(), kAllDTypes.end()},
    .dtype_rule =
        [](const OpArgs& a) {
          const DType in = a.inputs[0].dtype();
          const DType out = is_floating(in) ? in : DType::i64;
          return DTypePlan{{in}, {out}, in};
        },
    .shape_rule =
        [](const OpArgs& a) {
          return std::vector<Shape>{reduced_shape(a.inputs[0].shape(), axes_of(a), a.attrs.get_or("keepdim", false))};
        },
    .cpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          cpu::visit(a.inputs[0].dtype(), [&]<class T>() {
            using Acc = SumAcc<T>;
            cpu::visit(out[0].dtype(), [&]<class O>() {
              O* po = cpu::ptr<O>(out[0]);
              cpu::for_each_reduction<T, Acc>(a.inputs[0], axes_of(a), [&](std::int64_t i, std::span<const Acc> v) {
                po[i] = cpu::store<O>(cpu::pairwise_sum(v.data(), static_cast<std::int64_t>(v.size())));
              });
            });
          });
        },
    .gpu =
        [k = gpu::LazyKernel("sum")](const OpArgs& a, std::span<Tensor> out) {
          gpu::reduce(k.get(), a.inputs[0], axes_of(a), out[0]);
        },
    // The gradient spreads back over the summed axes: a broadcast view of g.
    .vjp =
        [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
          const Shape& in = c.input(0).shape;
          auto axes = reduction_axes(c.attrs(), static_cast<int>(in.size()), c.name());
          return {broadcast_to(reshape(g[0], reduced_shape(in, axes, true)), in)};
        },
    .test = {.attrs = {Attrs{{"axes", std::vector<std::int64_t>{0}}},
                       Attrs{{"axes", std::vector<std::int64_t>{-1}}, {"keepdim", true}},
                       Attrs{{"axes", std::vector<std::int64_t>{0, 2}}, {"keepdim", false}}}},
});

}  // namespace

Tensor sum(const Tensor& a, const std::vector<std::int64_t>& axes, bool keepdim) {
  return call(kSum, {a}, Attrs{{"axes", axes}, {"keepdim", keepdim}});
}

Tensor sum(const Tensor& a) {
  std::vector<std::int64_t> all(static_cast<std::size_t>(a.dim()));
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::int64_t>(i);
  return sum(a, all, false);
}

}  // namespace kiln
