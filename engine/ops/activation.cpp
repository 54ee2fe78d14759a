// Activations: sigmoid, relu, leaky_relu, gelu (exact), silu, softplus. Each OpDef holds
// its device expression (the kernel) and a CPU loop that follows prelude.cu.
#include <cmath>

#include "core/dtype_sets.h"
#include "elementwise_common.h"

namespace kiln {

namespace {

using G = std::span<const Tensor>;
using V = std::vector<Tensor>;

template <class F>
OpDef float_unary(std::string name, std::string expr, F f, decltype(PointwiseExpr::params) params = {}) {
  return elementwise_defs::unary_def<true, false>(
      std::move(name), dtype_sets::floating, rules::promote_float, [f](auto x, double p0, double) { return f(x, p0); },
      {.expr = std::move(expr), .domain = elementwise_defs::PointwiseDomain::floating, .params = std::move(params)});
}

constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)
constexpr double kSoftplusThreshold = 20;               // torch.nn.functional.softplus's

const OpRef kSigmoid = [] () -> const OpDef& {
  OpDef d = float_unary("sigmoid", "kiln::math::sigmoid(x)", [](auto x, double) {
    using C = decltype(x);
    return C(1) / (C(1) + std::exp(-x));
  });
  // y (1 - y), from the saved output.
  d.vjp = [](const VjpContext& c, G g) -> V {
    const Tensor y = c.saved_output(0);
    return {mul(mul(g[0], y), sub(1, y))};
  };
  d.save = {.outputs = {0}};
  return register_op(std::move(d));
}();

// relu's gradient from its saved output in one kernel: g where y > 0, else 0 (a where over a
// comparison takes three). Also the gradient of linear's fused ReLU.
const OpRef kReluBackward = [] () -> const OpDef& {
  OpDef d = elementwise_defs::binary_def<true, false>(
      "relu_backward", dtype_sets::floating, rules::promote_float,
      [](auto g, auto y) {
        using C = decltype(g);
        return y > C(0) ? g : C(0);
      },
      {.expr = "(b > C(0) ? a : C(0))", .domain = elementwise_defs::PointwiseDomain::floating});
  d.test.gradcheck = false;
  return register_op(std::move(d));
}();

// relu keeps every numeric dtype; NaN stays NaN as in the kernel's kiln::math::relu.
const OpRef kRelu = [] () -> const OpDef& {
  OpDef d = elementwise_defs::unary_def<false, false>(
      "relu", dtype_sets::numeric, rules::promote,
      [](auto x, double, double) {
        using C = decltype(x);
        return (x != x || x > C(0)) ? x : C(0);
      },
      {.expr = "kiln::math::relu(x)", .domain = elementwise_defs::PointwiseDomain::numeric});
  // The op reading y may have masked its gradient already (VjpContext::gradient_masked).
  d.vjp = [](const VjpContext& c, G g) -> V {
    return {c.gradient_masked(0) ? g[0] : relu_backward(g[0], c.saved_output(0))};
  };
  d.relu_masked_gradient = [](const Attrs&) { return true; };
  d.save = {.outputs = {0}};
  return register_op(std::move(d));
}();

// attrs "negative_slope" (double).
const OpRef kLeakyRelu = [] () -> const OpDef& {
  OpDef d = float_unary(
      "leaky_relu", "(x > C(0) ? x : x * C(p0))",
      [](auto x, double slope) {
        using C = decltype(x);
        return x > C(0) ? x : static_cast<C>(x * C(slope));
      },
      [](const Attrs& at) { return std::pair<double, double>{at.get_or<double>("negative_slope", 0.0), 0.0}; });
  d.vjp = [](const VjpContext& c, G g) -> V {
    const double slope = c.attrs().get<double>("negative_slope");
    return {where(gt(c.saved_input(0), 0), g[0], mul(g[0], slope))};
  };
  d.save = {.inputs = {0}};
  d.test.attrs = {Attrs{{"negative_slope", 0.01}}, Attrs{{"negative_slope", 0.3}}};
  return register_op(std::move(d));
}();

// Exact gelu, x Phi(x); d/dx = Phi(x) + x phi(x).
const OpRef kGelu = [] () -> const OpDef& {
  OpDef d = float_unary("gelu", "kiln::math::gelu(x)", [](auto x, double) {
    using C = decltype(x);
    return C(0.5) * x * (C(1) + std::erf(x * C(kInvSqrt2)));
  });
  d.vjp = [](const VjpContext& c, G g) -> V {
    const Tensor x = c.saved_input(0);
    Tensor cdf = mul(add(erf(mul(x, kInvSqrt2)), 1), 0.5);
    Tensor pdf = mul(exp(mul(square(x), -0.5)), kInvSqrt2Pi);
    return {mul(g[0], add(cdf, mul(x, pdf)))};
  };
  d.save = {.inputs = {0}};
  return register_op(std::move(d));
}();

// silu = x s(x); d/dx = s (1 + x (1 - s)).
const OpRef kSilu = [] () -> const OpDef& {
  OpDef d = float_unary("silu", "kiln::math::silu(x)", [](auto x, double) {
    using C = decltype(x);
    return x / (C(1) + std::exp(-x));
  });
  d.vjp = [](const VjpContext& c, G g) -> V {
    const Tensor x = c.saved_input(0);
    Tensor s = sigmoid(x);
    return {mul(g[0], mul(s, add(mul(x, sub(1, s)), 1)))};
  };
  d.save = {.inputs = {0}};
  return register_op(std::move(d));
}();

// Above the threshold softplus is x itself, and so is its gradient (PyTorch's backward).
const OpRef kSoftplus = [] () -> const OpDef& {
  OpDef d = float_unary("softplus", "kiln::math::softplus(x)", [](auto x, double) {
    using C = decltype(x);
    return x > C(kSoftplusThreshold) ? x : static_cast<C>(std::log1p(std::exp(x)));
  });
  d.vjp = [](const VjpContext& c, G g) -> V {
    const Tensor x = c.saved_input(0);
    return {where(gt(x, kSoftplusThreshold), g[0], mul(g[0], sigmoid(x)))};
  };
  d.save = {.inputs = {0}};
  d.test.low = -4;
  d.test.high = 4;
  return register_op(std::move(d));
}();

}  // namespace

Tensor sigmoid(const Tensor& x) { return call(kSigmoid, {x}); }
Tensor relu(const Tensor& x) { return call(kRelu, {x}); }
Tensor relu_backward(const Tensor& g, const Tensor& y) { return call(kReluBackward, {g, y}); }
Tensor leaky_relu(const Tensor& x, double negative_slope) {
  return call(kLeakyRelu, {x}, Attrs{{"negative_slope", negative_slope}});
}
Tensor gelu(const Tensor& x) { return call(kGelu, {x}); }
Tensor silu(const Tensor& x) { return call(kSilu, {x}); }
Tensor softplus(const Tensor& x) { return call(kSoftplus, {x}); }

}  // namespace kiln
