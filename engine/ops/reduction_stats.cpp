// var and std (sum of squared deviations over N - correction) and logsumexp. The CPU
// references are two-pass (mean, then deviations) and max-shifted, both with pairwise
// sums; the GPU kernels use Welford/Chan and an online rescaled sum instead.
#include <cmath>
#include <limits>

#include "core/dtype_sets.h"
#include "reduction_common.h"

namespace kiln {

namespace {

using namespace reduction;

// In f64: f32 values near their maximum overflow neither the sum nor the squared
// deviations (PyTorch and the GPU kernels accumulate in f64 too). An f64 sum that
// overflows is summed again from x/n.
template <class A>
A variance(std::span<const A> v, double correction) {
  const auto n = static_cast<std::int64_t>(v.size());
  std::vector<double> x(v.begin(), v.end());
  double mean = cpu::pairwise_sum(x.data(), n) / static_cast<double>(n);
  if (std::isinf(mean)) {
    for (double& e : x) e /= static_cast<double>(n);
    mean = cpu::pairwise_sum(x.data(), n);
  }
  for (std::size_t i = 0; i < v.size(); ++i) x[i] = (static_cast<double>(v[i]) - mean) * (static_cast<double>(v[i]) - mean);
  const double dof = static_cast<double>(n) - correction;
  return static_cast<A>(cpu::pairwise_sum(x.data(), n) / (dof > 0 ? dof : 0.0));  // empty: 0/0 = NaN
}

Attrs var_attrs(const std::vector<std::int64_t>& axes, bool keepdim, double correction) {
  return Attrs{{"axes", axes}, {"keepdim", keepdim}, {"correction", correction}};
}

std::vector<Attrs> var_test_attrs() {
  auto attrs = test_attrs();
  attrs.push_back(var_attrs({1}, true, 0.0));
  attrs.push_back(var_attrs({0, 1}, false, 2.0));
  return attrs;
}

// d var / d x_i = 2 (x_i - mean) / (N - correction).
Tensor deviation_grad(const VjpContext& c, const Tensor& x) {
  const Shape& in = c.input(0).shape;
  const double dof = static_cast<double>(reduced_count(in, axes_of(c.attrs(), in, c.name()))) - correction_of(c.attrs());
  return (x - mean(x, axes_i64(c), true)) / std::max(dof, 0.0);
}

template <bool kStd>
OpDef var_def(const char* name) {
  return OpDef{
      .name = name,
      .dtypes = dtype_sets::floating,
      .dtype_rule = rules::promote_float,
      .shape_rule = [](const OpArgs& a) { return shape_rule(a, false); },
      .cpu =
          [](const OpArgs& a, std::span<Tensor> out) {
            const double corr = correction_of(a.attrs);
            cpu_reduce<WideAcc>(a.inputs[0], axes_of(a), out[0], [corr](auto v) {
              auto r = variance(v, corr);
              if constexpr (kStd) r = std::sqrt(r);
              return r;
            });
          },
      .gpu =
          [k = gpu::LazyKernel(name)](const OpArgs& a, std::span<Tensor> out) {
            gpu_reduce(k.get(), a, out[0], correction_of(a.attrs));
          },
      .vjp =
          [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
            const Tensor d = deviation_grad(c, c.saved_input(0));
            // d / std before g: in f16, g times a deviation near the max overflows.
            if constexpr (kStd) return {expand_back(g[0], c) * (d / expand_back(c.saved_output(0), c))};
            else return {expand_back(g[0], c) * d * 2.0};
          },
      .save = {.inputs = {0}, .outputs = kStd ? std::vector<int>{0} : std::vector<int>{}},
      .test = {.attrs = var_test_attrs()},
  };
}

const OpDef& kVar = register_op(var_def<false>("var"));
const OpDef& kStd = register_op(var_def<true>("std"));

// A non-finite maximum (NaN, +inf, or -inf when every element is, or the dim is empty)
// is the answer; otherwise max + log(sum(exp(x - max))).
template <class A>
A log_sum_exp(std::span<const A> v) {
  A m = -std::numeric_limits<A>::infinity();
  for (A x : v) {
    if (std::isnan(x)) return x;
    m = std::max(m, x);
  }
  if (!std::isfinite(m)) return m;
  std::vector<A> e(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) e[i] = std::exp(v[i] - m);
  return m + std::log(cpu::pairwise_sum(e.data(), static_cast<std::int64_t>(e.size())));
}

const OpDef& kLogSumExp = register_op({
    .name = "logsumexp",
    .dtypes = dtype_sets::floating,
    .dtype_rule = rules::promote_float,
    .shape_rule = [](const OpArgs& a) { return shape_rule(a, false); },
    .cpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          cpu_reduce<WideAcc>(a.inputs[0], axes_of(a), out[0], [](auto v) {
            using A = typename decltype(v)::value_type;
            if constexpr (std::is_floating_point_v<A>) return log_sum_exp(v);
            else return A(0);  // unreachable: the dtype rule makes every input floating
          });
        },
    .gpu =
        [k = gpu::LazyKernel("logsumexp")](const OpArgs& a, std::span<Tensor> out) { gpu_reduce(k.get(), a, out[0]); },
    // d lse / d x_i = exp(x_i - lse): the softmax of x over the reduced axes.
    .vjp =
        [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
          const Tensor shifted = c.saved_input(0) - expand_back(c.saved_output(0), c);
          return {expand_back(g[0], c) * run_op("exp", {shifted})};
        },
    .save = {.inputs = {0}, .outputs = {0}},
    .test = {.attrs = test_attrs()},
});

}  // namespace

Tensor var(const Tensor& a, const std::vector<std::int64_t>& axes, bool keepdim, double correction) {
  return call(kVar, {a}, var_attrs(axes, keepdim, correction));
}
Tensor var(const Tensor& a) { return var(a, all_axes(a)); }
Tensor std(const Tensor& a, const std::vector<std::int64_t>& axes, bool keepdim, double correction) {
  return call(kStd, {a}, var_attrs(axes, keepdim, correction));
}
Tensor std(const Tensor& a) { return std(a, all_axes(a)); }

Tensor logsumexp(const Tensor& a, const std::vector<std::int64_t>& axes, bool keepdim) {
  return call(kLogSumExp, {a}, Attrs{{"axes", axes}, {"keepdim", keepdim}});
}
Tensor logsumexp(const Tensor& a) { return logsumexp(a, all_axes(a)); }

}  // namespace kiln
