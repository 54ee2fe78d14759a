// Unary math: abs, sign, square, exp, log, log1p, expm1, sqrt, rsqrt, sin, cos, tanh,
// erf, floor, ceil, round, clamp. Each OpDef holds its device expression (the kernel of the
// same name) and a CPU loop that follows kernel_templates/prelude.cu, so both
// devices agree on NaN and signed zero.
#include <cmath>
#include <limits>

#include "core/dtype_sets.h"
#include "elementwise_common.h"

namespace kiln {

namespace {

using G = std::span<const Tensor>;
using V = std::vector<Tensor>;
using elementwise_defs::PointwiseDomain;

// A floating function: integer and bool inputs become f32.
template <class F>
const OpDef& float_unary(std::string name, const char* expr, F f, Vjp vjp, SavePolicy save, TestHints test = {}) {
  OpDef d = elementwise_defs::unary_def<true, false>(std::move(name), dtype_sets::floating, rules::promote_float,
                                       [f](auto x, double, double) { return f(x); },
                                       {.expr = expr, .domain = PointwiseDomain::floating});
  d.vjp = std::move(vjp);
  d.save = std::move(save);
  d.test = std::move(test);
  return register_op(std::move(d));
}

// A function of every numeric dtype (the result keeps the input's dtype).
template <class F>
const OpDef& numeric_unary(std::string name, const char* expr, F f, Vjp vjp, SavePolicy save, TestHints test = {}) {
  OpDef d = elementwise_defs::unary_def<false, false>(std::move(name), dtype_sets::numeric, rules::promote,
                                        [f](auto x, double, double) { return f(x); },
                                        {.expr = expr, .domain = PointwiseDomain::numeric});
  d.vjp = std::move(vjp);
  d.save = std::move(save);
  d.test = std::move(test);
  return register_op(std::move(d));
}

// Rounding: the floating kernel, or a plain copy for integers (already whole numbers).
template <class F>
const OpDef& rounding_unary(std::string name, const char* expr, F f) {
  OpDef d;
  d.name = name;
  d.dtypes = dtype_sets::numeric;
  d.cpu = [f](const OpArgs& a, std::span<Tensor> out) {
    elementwise_defs::cpu_unary<false, false>(a.inputs[0], out[0], [&](auto x) {
      if constexpr (std::is_floating_point_v<decltype(x)>) return f(x);
      else return x;
    });
  };
  d.gpu = [k = gpu::LazyKernel(name)](const OpArgs& a, std::span<Tensor> out) {
    const DType t = a.inputs[0].dtype();
    if (is_floating(t))
      kernels::launch_unary(k.get(), t, t, gpu::operand(a.inputs[0]), gpu::operand(out[0]), out[0].shape(), 0, 0,
                            stream_of(a.device));
    else
      kernels::launch_cast(t, t, gpu::operand(a.inputs[0]), gpu::operand(out[0]), out[0].shape(), stream_of(a.device));
  };
  d.pointwise = PointwiseExpr{.expr = expr, .domain = PointwiseDomain::floating};
  // Piecewise constant: zero gradient, as PyTorch.
  d.vjp = [](const VjpContext&, G g) -> V { return {zeros_like(g[0])}; };
  return register_op(std::move(d));
}

constexpr double kInvSqrtPi2 = 1.12837916709551257390;  // 2 / sqrt(pi)

const OpRef kAbs = numeric_unary(
    "abs", "kiln::math::abs(x)",
    [](auto x) {
      using C = decltype(x);
      if constexpr (std::is_floating_point_v<C>) return std::fabs(x);
      else if constexpr (std::is_unsigned_v<C>) return x;
      else return x < C(0) ? C(-x) : x;
    },
    [](const VjpContext& c, G g) -> V { return {mul(g[0], sign(c.saved_input(0)))}; }, {.inputs = {0}});

// sign(NaN) = 0 and sign(-0.0) = +0, like the kernel's kiln::math::sign.
const OpRef kSign = numeric_unary(
    "sign", "kiln::math::sign(x)",
    [](auto x) {
      using C = decltype(x);
      return static_cast<C>(static_cast<int>(C(0) < x) - static_cast<int>(x < C(0)));
    },
    [](const VjpContext&, G g) -> V { return {zeros_like(g[0])}; }, {});

// Integers square in unsigned arithmetic: wrapping, never undefined overflow.
const OpRef kSquare = numeric_unary(
    "square", "x * x",
    [](auto x) {
      using C = decltype(x);
      if constexpr (std::is_signed_v<C> && std::is_integral_v<C>) {
        using U = std::make_unsigned_t<C>;
        return static_cast<C>(static_cast<U>(x) * static_cast<U>(x));
      } else {
        return static_cast<C>(x * x);
      }
    },
    [](const VjpContext& c, G g) -> V { return {mul(mul(g[0], c.saved_input(0)), 2)}; }, {.inputs = {0}});

const OpRef kExp = float_unary(
    "exp", "kiln::math::exp(x)", [](auto x) { return std::exp(x); },
    [](const VjpContext& c, G g) -> V { return {mul(g[0], c.saved_output(0))}; }, {.outputs = {0}});

const OpRef kLog = float_unary(
    "log", "kiln::math::log(x)", [](auto x) { return std::log(x); },
    [](const VjpContext& c, G g) -> V { return {div(g[0], c.saved_input(0))}; }, {.inputs = {0}},
    {.low = 0.5, .high = 3.0});

const OpRef kLog1p = float_unary(
    "log1p", "kiln::math::log1p(x)", [](auto x) { return std::log1p(x); },
    [](const VjpContext& c, G g) -> V { return {div(g[0], add(c.saved_input(0), 1))}; }, {.inputs = {0}},
    {.low = -0.5, .high = 2.0});

const OpRef kExpm1 = float_unary(
    "expm1", "kiln::math::expm1(x)", [](auto x) { return std::expm1(x); },
    [](const VjpContext& c, G g) -> V { return {mul(g[0], add(c.saved_output(0), 1))}; }, {.outputs = {0}});

const OpRef kSqrt = float_unary(
    "sqrt", "kiln::math::sqrt(x)", [](auto x) { return std::sqrt(x); },
    [](const VjpContext& c, G g) -> V { return {div(g[0], mul(c.saved_output(0), 2))}; }, {.outputs = {0}},
    {.low = 0.5, .high = 3.0});

// d rsqrt(x) = -x^(-3/2) / 2 = -y^3 / 2.
const OpRef kRsqrt = float_unary(
    "rsqrt", "kiln::math::rsqrt(x)",
    [](auto x) {
      using C = decltype(x);
      return C(1) / std::sqrt(x);
    },
    [](const VjpContext& c, G g) -> V {
      const Tensor& y = c.saved_output(0);
      return {mul(mul(g[0], mul(square(y), y)), -0.5)};
    },
    {.outputs = {0}}, {.low = 0.5, .high = 3.0});

const OpRef kSin = float_unary(
    "sin", "kiln::math::sin(x)", [](auto x) { return std::sin(x); },
    [](const VjpContext& c, G g) -> V { return {mul(g[0], cos(c.saved_input(0)))}; }, {.inputs = {0}});

const OpRef kCos = float_unary(
    "cos", "kiln::math::cos(x)", [](auto x) { return std::cos(x); },
    [](const VjpContext& c, G g) -> V { return {neg(mul(g[0], sin(c.saved_input(0))))}; }, {.inputs = {0}});

const OpRef kTanh = float_unary(
    "tanh", "kiln::math::tanh(x)", [](auto x) { return std::tanh(x); },
    [](const VjpContext& c, G g) -> V { return {mul(g[0], sub(1, square(c.saved_output(0))))}; },
    {.outputs = {0}});

const OpRef kErf = float_unary(
    "erf", "kiln::math::erf(x)", [](auto x) { return std::erf(x); },
    [](const VjpContext& c, G g) -> V {
      const Tensor& x = c.saved_input(0);
      return {mul(g[0], mul(exp(neg(square(x))), kInvSqrtPi2))};
    },
    {.inputs = {0}});

// std::nearbyint rounds half to even in the default rounding mode, as the kernel's rint.
const OpRef kFloor = rounding_unary("floor", "kiln::math::floor(x)", [](auto x) { return std::floor(x); });
const OpRef kCeil = rounding_unary("ceil", "kiln::math::ceil(x)", [](auto x) { return std::ceil(x); });
const OpRef kRound = rounding_unary("round", "kiln::math::rint(x)", [](auto x) { return std::nearbyint(x); });

// ---- clamp: attrs "min" and/or "max" (Scalars) ----

double bound(const Attrs& at, const char* name, double none) {
  return at.has(name) ? at.get<Scalar>(name).to_double() : none;
}

std::pair<double, double> clamp_params(const Attrs& at) {
  return {bound(at, "min", -std::numeric_limits<double>::infinity()),
          bound(at, "max", std::numeric_limits<double>::infinity())};
}

// The bounds promote with the input like scalar operands.
DTypePlan clamp_dtypes(const OpArgs& a) {
  if (!a.attrs.has("min") && !a.attrs.has("max"))
    throw ValueError("[clamp] at least one of min and max must be given");
  ResultType r;
  r.add(a.inputs[0]);
  if (a.attrs.has("min")) r.add(a.attrs.get<Scalar>("min"));
  if (a.attrs.has("max")) r.add(a.attrs.get<Scalar>("max"));
  const DType d = r.get();
  return {.inputs = {d}, .outputs = {d}, .key = d};
}

const OpRef kClamp = [] () -> const OpDef& {
  // As kiln::math::clamp: NaN stays, comparisons in double, lo > hi gives hi.
  OpDef d = elementwise_defs::unary_def<false, false>(
      "clamp", dtype_sets::numeric, clamp_dtypes,
      [](auto x, double lo, double hi) {
        using C = decltype(x);
        if (x != x) return x;
        const double xd = static_cast<double>(x);
        if (xd > hi || lo > hi) return static_cast<C>(hi);
        if (xd < lo) return static_cast<C>(lo);
        return x;
      },
      {.expr = "kiln::math::clamp(x, p0, p1)", .domain = PointwiseDomain::numeric, .params = clamp_params});
  // The gradient flows where min <= x <= max (nowhere when min > max).
  d.vjp = [](const VjpContext& c, G g) -> V {
    const Tensor& x = c.saved_input(0);
    const Attrs& at = c.attrs();
    Tensor inside;
    if (at.has("min")) inside = ge(x, at.get<Scalar>("min"));
    if (at.has("max")) {
      Tensor below = le(x, at.get<Scalar>("max"));
      inside = inside.defined() ? logical_and(inside, below) : below;
    }
    return {elementwise_defs::masked(g[0], inside)};
  };
  d.save = {.inputs = {0}};
  d.test.attrs = {Attrs{{"min", Scalar(-1.0)}, {"max", Scalar(1.0)}}, Attrs{{"min", Scalar(0.5)}},
                  Attrs{{"max", Scalar(-0.5)}}, Attrs{{"min", Scalar(1.0)}, {"max", Scalar(-1.0)}}};
  return register_op(std::move(d));
}();

}  // namespace

Tensor abs(const Tensor& x) { return call(kAbs, {x}); }
Tensor sign(const Tensor& x) { return call(kSign, {x}); }
Tensor square(const Tensor& x) { return call(kSquare, {x}); }
Tensor exp(const Tensor& x) { return call(kExp, {x}); }
Tensor log(const Tensor& x) { return call(kLog, {x}); }
Tensor log1p(const Tensor& x) { return call(kLog1p, {x}); }
Tensor expm1(const Tensor& x) { return call(kExpm1, {x}); }
Tensor sqrt(const Tensor& x) { return call(kSqrt, {x}); }
Tensor rsqrt(const Tensor& x) { return call(kRsqrt, {x}); }
Tensor sin(const Tensor& x) { return call(kSin, {x}); }
Tensor cos(const Tensor& x) { return call(kCos, {x}); }
Tensor tanh(const Tensor& x) { return call(kTanh, {x}); }
Tensor erf(const Tensor& x) { return call(kErf, {x}); }
Tensor floor(const Tensor& x) { return call(kFloor, {x}); }
Tensor ceil(const Tensor& x) { return call(kCeil, {x}); }
Tensor round(const Tensor& x) { return call(kRound, {x}); }

Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max) {
  Attrs at;
  if (min) at.set("min", *min);
  if (max) at.set("max", *max);
  return call(kClamp, {x}, at);
}

}  // namespace kiln
