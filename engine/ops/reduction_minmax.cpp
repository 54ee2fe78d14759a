// max, min (NaN propagates, dtype kept) and argmax, argmin (i64 indices of the first
// occurrence; NaN counts as the extreme). None of them has an identity, so reducing an
// empty dim is a ValueError raised by the shape rule, on both devices.
#include <string>

#include "core/dtype_sets.h"
#include "reduction_common.h"

namespace kiln {

namespace {

using namespace reduction;

// kMax: the largest wins, else the smallest. The first NaN wins over everything.
template <bool kMax>
auto extreme = [](auto v) {
  auto m = v[0];
  for (std::size_t i = 1; i < v.size() && !is_nan(m); ++i)
    if (is_nan(v[i]) || (kMax ? v[i] > m : v[i] < m)) m = v[i];
  return m;
};

template <bool kMax>
auto extreme_index = [](auto v) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < v.size() && !is_nan(v[best]); ++i)
    if (is_nan(v[i]) || (kMax ? v[i] > v[best] : v[i] < v[best])) best = i;
  return static_cast<std::int64_t>(best);
};

// The gradient goes to the positions equal to the result, split evenly among ties.
std::vector<Tensor> extreme_vjp(const VjpContext& c, std::span<const Tensor> g) {
  const Tensor x = c.saved_input(0);
  const Tensor mask = cast(run_op("eq", {x, expand_back(c.saved_output(0), c)}), x.dtype());
  const Tensor ties = sum(mask, axes_i64(c), true);
  return {mask * expand_back(g[0], c) / ties};
}

template <bool kMax>
OpDef extreme_def(const char* name) {
  return OpDef{
      .name = name,
      .dtypes = {kAllDTypes.begin(), kAllDTypes.end()},
      .dtype_rule = rules::same_as_input,
      .shape_rule = [](const OpArgs& a) { return shape_rule(a, true); },
      .cpu = [](const OpArgs& a,
                std::span<Tensor> out) { cpu_reduce<SameAcc>(a.inputs[0], axes_of(a), out[0], extreme<kMax>); },
      .gpu = [k = gpu::LazyKernel(name)](const OpArgs& a, std::span<Tensor> out) { gpu_reduce(k.get(), a, out[0]); },
      .vjp = extreme_vjp,
      .save = {.inputs = {0}, .outputs = {0}},
      .test = {.attrs = test_attrs()},
  };
}

// One axis, or every axis (the index into the flattened tensor), as in PyTorch.
std::vector<Shape> arg_shape_rule(const OpArgs& a) {
  const int nd = a.inputs[0].dim();
  const auto axes = axes_of(a);
  if (axes.size() > 1 && static_cast<int>(axes.size()) != nd)
    throw ValueError("[" + a.name() + "] takes one axis or every axis; got " + std::to_string(axes.size()) +
                     " axes of shape " + shape_str(a.inputs[0].shape()));
  return shape_rule(a, true);
}

template <bool kMax>
OpDef arg_def(const char* name) {
  return OpDef{
      .name = name,
      .dtypes = dtype_sets::numeric,
      // Bool compares as u8 (the kernels take no bool input here).
      .dtype_rule =
          [](const OpArgs& a) {
            const DType in = a.inputs[0].dtype() == DType::boolean ? DType::u8 : a.inputs[0].dtype();
            return DTypePlan{{in}, {DType::i64}, in};
          },
      .shape_rule = arg_shape_rule,
      .cpu = [](const OpArgs& a,
                std::span<Tensor> out) { cpu_reduce<SameAcc>(a.inputs[0], axes_of(a), out[0], extreme_index<kMax>); },
      .gpu = [k = gpu::LazyKernel(name)](const OpArgs& a, std::span<Tensor> out) { gpu_reduce(k.get(), a, out[0]); },
      .test = {.attrs = {Attrs{{"axes", std::vector<std::int64_t>{0}}},
                         Attrs{{"axes", std::vector<std::int64_t>{-1}}, {"keepdim", true}}, Attrs{}},
               .gradcheck = false},
  };
}

const OpDef& kMax = register_op(extreme_def<true>("max"));
const OpDef& kMin = register_op(extreme_def<false>("min"));
const OpDef& kArgMax = register_op(arg_def<true>("argmax"));
const OpDef& kArgMin = register_op(arg_def<false>("argmin"));

Attrs axes_attrs(const std::vector<std::int64_t>& axes, bool keepdim) {
  return Attrs{{"axes", axes}, {"keepdim", keepdim}};
}

}  // namespace

Tensor max(const Tensor& a, const std::vector<std::int64_t>& axes, bool keepdim) {
  return call(kMax, {a}, axes_attrs(axes, keepdim));
}
Tensor max(const Tensor& a) { return max(a, all_axes(a), false); }
Tensor min(const Tensor& a, const std::vector<std::int64_t>& axes, bool keepdim) {
  return call(kMin, {a}, axes_attrs(axes, keepdim));
}
Tensor min(const Tensor& a) { return min(a, all_axes(a), false); }

Tensor argmax(const Tensor& a, std::int64_t axis, bool keepdim) {
  return call(kArgMax, {a}, axes_attrs({axis}, keepdim));
}
Tensor argmax(const Tensor& a) { return call(kArgMax, {a}, axes_attrs(all_axes(a), false)); }
Tensor argmin(const Tensor& a, std::int64_t axis, bool keepdim) {
  return call(kArgMin, {a}, axes_attrs({axis}, keepdim));
}
Tensor argmin(const Tensor& a) { return call(kArgMin, {a}, axes_attrs(all_axes(a), false)); }

}  // namespace kiln
