// add, sub, mul, div (tensor-tensor with broadcasting, and tensor-scalar) and neg, built
// like the other elementwise ops (engine/ops/elementwise_common.h); the scalar forms run
// the kernels of add, sub, mul and div with a host scalar.
#include "ops/sum_to.h"
#include "core/dtype_sets.h"
#include "elementwise_common.h"

namespace kiln {

namespace {

using elementwise_defs::PointwiseDomain;
using elementwise_defs::scalar_of;

// out = f(a, b) with broadcasting; `expr` is the kernel's device expression.
template <bool FloatOnly, class F>
OpDef binary(std::string name, std::vector<DType> dtypes, DTypeRule rule, F f, const char* expr, Vjp vjp,
             SavePolicy save, TestHints test = {}) {
  const PointwiseDomain domain = FloatOnly ? PointwiseDomain::floating : PointwiseDomain::numeric;
  OpDef d = elementwise_defs::binary_def<FloatOnly, false>(std::move(name), std::move(dtypes), std::move(rule), f,
                                             {.expr = expr, .domain = domain});
  d.vjp = std::move(vjp);
  d.save = std::move(save);
  d.test = std::move(test);
  return d;
}

// out = f(a, s) for the scalar in attrs "scalar"; f(s, a) when `scalar_first` (rsub, rdiv).
template <bool FloatOnly, class F>
OpDef binary_scalar(std::string name, std::string kernel, bool scalar_first, std::vector<DType> dtypes, DTypeRule rule,
                    F f, Vjp vjp, SavePolicy save, double low = -2.0) {
  OpDef d = elementwise_defs::binary_scalar_def<FloatOnly, false>(std::move(name), std::move(kernel), scalar_first, std::move(dtypes),
                                                    std::move(rule), f);
  d.vjp = std::move(vjp);
  d.save = std::move(save);
  d.test.low = low;
  return d;
}

using G = std::span<const Tensor>;
using V = std::vector<Tensor>;

const OpDef& kAdd = register_op(binary<false>(
    "add", dtype_sets::numeric, rules::promote, [](auto a, auto b) { return a + b; }, "a + b",
    [](const VjpContext& c, G g) -> V { return {sum_to(g[0], c.input(0).shape), sum_to(g[0], c.input(1).shape)}; },
    {}));

const OpDef& kSub = register_op(binary<false>(
    "sub", dtype_sets::numeric, rules::promote, [](auto a, auto b) { return a - b; }, "a - b",
    [](const VjpContext& c, G g) -> V {
      return {sum_to(g[0], c.input(0).shape), c.needs_grad(1) ? sum_to(neg(g[0]), c.input(1).shape) : Tensor()};
    },
    {}));

const OpDef& kMul = register_op(binary<false>(
    "mul", dtype_sets::numeric, rules::promote, [](auto a, auto b) { return a * b; }, "a * b",
    [](const VjpContext& c, G g) -> V {
      V r(2);
      if (c.needs_grad(0)) r[0] = sum_to(mul(g[0], c.saved_input(1)), c.input(0).shape);
      if (c.needs_grad(1)) r[1] = sum_to(mul(g[0], c.saved_input(0)), c.input(1).shape);
      return r;
    },
    {.inputs = {0, 1}}));

// d(a/b) = g/b, -g*a/b^2 = -g * (out / b): out / b is 0 where a is, while g/b may
// overflow a subnormal b and turn (g/b) * out into inf * 0 = NaN (PyTorch's order too).
const OpDef& kDiv = register_op(binary<true>(
    "div", dtype_sets::floating, rules::promote_float, [](auto a, auto b) { return a / b; }, "a / b",
    [](const VjpContext& c, G g) -> V {
      V r(2);
      if (c.needs_grad(0)) r[0] = sum_to(div(g[0], c.saved_input(1)), c.input(0).shape);
      if (c.needs_grad(1)) r[1] = sum_to(neg(mul(g[0], div(c.saved_output(0), c.saved_input(1)))), c.input(1).shape);
      return r;
    },
    {.inputs = {1}, .outputs = {0}}, {.low = 0.5, .high = 2.0}));  // away from the pole at b = 0

const OpDef& kAddScalar = register_op(binary_scalar<false>(
    "add_scalar", "add", false, dtype_sets::numeric, rules::promote, [](auto a, auto b) { return a + b; },
    [](const VjpContext&, G g) -> V { return {g[0]}; }, {}));

const OpDef& kSubScalar = register_op(binary_scalar<false>(
    "sub_scalar", "sub", false, dtype_sets::numeric, rules::promote, [](auto a, auto b) { return a - b; },
    [](const VjpContext&, G g) -> V { return {g[0]}; }, {}));

const OpDef& kRsubScalar = register_op(binary_scalar<false>(
    "rsub_scalar", "sub", true, dtype_sets::numeric, rules::promote, [](auto a, auto b) { return a - b; },
    [](const VjpContext&, G g) -> V { return {neg(g[0])}; }, {}));

const OpDef& kMulScalar = register_op(binary_scalar<false>(
    "mul_scalar", "mul", false, dtype_sets::numeric, rules::promote, [](auto a, auto b) { return a * b; },
    [](const VjpContext& c, G g) -> V { return {mul(g[0], scalar_of(c))}; }, {}));

const OpDef& kDivScalar = register_op(binary_scalar<true>(
    "div_scalar", "div", false, dtype_sets::floating, rules::promote_float, [](auto a, auto b) { return a / b; },
    [](const VjpContext& c, G g) -> V { return {div(g[0], scalar_of(c))}; }, {}));

// d(s/a) = -g*s/a^2 = -g*out/a.
const OpDef& kRdivScalar = register_op(binary_scalar<true>(
    "rdiv_scalar", "div", true, dtype_sets::floating, rules::promote_float, [](auto a, auto b) { return a / b; },
    [](const VjpContext& c, G g) -> V { return {neg(div(mul(g[0], c.saved_output(0)), c.saved_input(0)))}; },
    {.inputs = {0}, .outputs = {0}}, 0.5));

const OpDef& kNeg = [] () -> const OpDef& {
  OpDef d = elementwise_defs::unary_def<false, false>("neg", dtype_sets::numeric, rules::promote, [](auto x, double, double) { return -x; },
                                        {.expr = "-x", .domain = PointwiseDomain::numeric});
  d.vjp = [](const VjpContext&, G g) -> V { return {neg(g[0])}; };
  return register_op(std::move(d));
}();

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return call(kAdd, {a, b}); }
Tensor sub(const Tensor& a, const Tensor& b) { return call(kSub, {a, b}); }
Tensor mul(const Tensor& a, const Tensor& b) { return call(kMul, {a, b}); }
Tensor div(const Tensor& a, const Tensor& b) { return call(kDiv, {a, b}); }
Tensor add(const Tensor& a, const Scalar& b) { return call(kAddScalar, {a}, elementwise_defs::scalar_attrs(b)); }
Tensor sub(const Tensor& a, const Scalar& b) { return call(kSubScalar, {a}, elementwise_defs::scalar_attrs(b)); }
Tensor sub(const Scalar& a, const Tensor& b) { return call(kRsubScalar, {b}, elementwise_defs::scalar_attrs(a)); }
Tensor mul(const Tensor& a, const Scalar& b) { return call(kMulScalar, {a}, elementwise_defs::scalar_attrs(b)); }
Tensor div(const Tensor& a, const Scalar& b) { return call(kDivScalar, {a}, elementwise_defs::scalar_attrs(b)); }
Tensor div(const Scalar& a, const Tensor& b) { return call(kRdivScalar, {b}, elementwise_defs::scalar_attrs(a)); }
Tensor neg(const Tensor& a) { return call(kNeg, {a}); }

}  // namespace kiln
