// pow, maximum, minimum (tensor-tensor with broadcasting, tensor-scalar, and scalar ** tensor)
// and where(cond, a, b). GPU: the binary kernels of the same names (variant 2 for a host
// scalar) and the where kernel.
#include <cmath>

#include "ops/sum_to.h"
#include "core/dtype_sets.h"
#include "elementwise_common.h"

namespace kiln {

namespace {

using G = std::span<const Tensor>;
using V = std::vector<Tensor>;

// ---- pow ----

auto pow_fn = [](auto a, auto b) { return std::pow(a, b); };

Scalar minus_one(const Scalar& s) {
  return s.is_floating() ? Scalar(s.to_double() - 1.0) : Scalar(s.to_int() - 1);
}

// d(a^b)/da = b a^(b-1), 0 where b == 0 (PyTorch's pow_backward_self).
Tensor pow_grad_base(const Tensor& g, const Tensor& a, const Tensor& b) {
  return where(eq(b, 0), Scalar(0), mul(g, mul(b, pow(a, sub(b, 1)))));
}
// d(a^b)/db = a^b log(a), 0 where a == 0 and b >= 0 (PyTorch's pow_backward_exponent).
Tensor pow_grad_exponent(const Tensor& g, const Tensor& a, const Tensor& b, const Tensor& y) {
  return where(logical_and(eq(a, 0), ge(b, 0)), Scalar(0), mul(g, mul(y, log(a))));
}

const OpRef kPow = [] () -> const OpDef& {
  OpDef d = elementwise_defs::binary_def<true, false>("pow", dtype_sets::floating, rules::promote_float, pow_fn,
                                        {.expr = "kiln::math::pow(a, b)", .domain = elementwise_defs::PointwiseDomain::floating});
  d.vjp = [](const VjpContext& c, G g) -> V {
    const Tensor a = c.saved_input(0), b = c.saved_input(1);
    V r(2);
    if (c.needs_grad(0)) r[0] = sum_to(pow_grad_base(g[0], a, b), c.input(0).shape);
    if (c.needs_grad(1)) r[1] = sum_to(pow_grad_exponent(g[0], a, b, c.saved_output(0)), c.input(1).shape);
    return r;
  };
  d.save = {.inputs = {0, 1}, .outputs = {0}};
  d.test.low = 0.5;  // a positive base: log(a) is real
  return register_op(std::move(d));
}();

const OpRef kPowScalar = [] () -> const OpDef& {
  OpDef d = elementwise_defs::binary_scalar_def<true, false>("pow_scalar", "pow", false, dtype_sets::floating, rules::promote_float, pow_fn);
  d.vjp = [](const VjpContext& c, G g) -> V {
    const Scalar s = elementwise_defs::scalar_of(c);
    if (s.to_double() == 0) return {zeros_like(g[0])};
    return {mul(g[0], mul(pow(c.saved_input(0), minus_one(s)), s))};
  };
  d.save = {.inputs = {0}};
  d.test.low = 0.5;
  return register_op(std::move(d));
}();

// s ** x: d/dx = s^x log(s), 0 where s == 0 and x >= 0.
const OpRef kRpowScalar = [] () -> const OpDef& {
  OpDef d = elementwise_defs::binary_scalar_def<true, false>("rpow_scalar", "pow", true, dtype_sets::floating, rules::promote_float, pow_fn);
  d.vjp = [](const VjpContext& c, G g) -> V {
    const double s = elementwise_defs::scalar_of(c).to_double();
    Tensor r = mul(mul(g[0], c.saved_output(0)), std::log(s));
    if (s == 0) r = where(ge(c.saved_input(0), 0), Scalar(0), r);
    return {r};
  };
  d.save = {.inputs = {0}, .outputs = {0}};
  d.test.attrs = {Attrs{{"scalar", Scalar(2)}}, Attrs{{"scalar", Scalar(0.5)}}};
  return register_op(std::move(d));
}();

// ---- maximum / minimum: NaN propagates, as the kernels' kiln::math::maximum/minimum ----

auto max_fn = [](auto a, auto b) { return a != a ? a : b != b ? b : (a > b ? a : b); };
auto min_fn = [](auto a, auto b) { return a != a ? a : b != b ? b : (a < b ? a : b); };

// g where this side wins, g/2 on ties (PyTorch splits the gradient evenly).
Tensor share(const Tensor& g, const Tensor& wins, const Tensor& ties) {
  return add(elementwise_defs::masked(g, wins), elementwise_defs::masked(mul(g, 0.5), ties));
}

template <class F>
const OpDef& extremum(const char* name, const char* expr, F f, bool is_max) {
  OpDef d = elementwise_defs::binary_def<false, false>(name, dtype_sets::numeric, rules::promote, f,
                                         {.expr = expr, .domain = elementwise_defs::PointwiseDomain::numeric});
  d.vjp = [is_max](const VjpContext& c, G g) -> V {
    const Tensor a = c.saved_input(0), b = c.saved_input(1);
    const Tensor ties = eq(a, b);
    V r(2);
    if (c.needs_grad(0)) r[0] = sum_to(share(g[0], is_max ? gt(a, b) : lt(a, b), ties), c.input(0).shape);
    if (c.needs_grad(1)) r[1] = sum_to(share(g[0], is_max ? lt(a, b) : gt(a, b), ties), c.input(1).shape);
    return r;
  };
  d.save = {.inputs = {0, 1}};
  return register_op(std::move(d));
}

template <class F>
const OpDef& extremum_scalar(const char* name, const char* kernel, F f, bool is_max) {
  OpDef d = elementwise_defs::binary_scalar_def<false, false>(name, kernel, false, dtype_sets::numeric, rules::promote, f);
  d.vjp = [is_max](const VjpContext& c, G g) -> V {
    const Tensor a = c.saved_input(0);
    const Scalar s = elementwise_defs::scalar_of(c);
    return {share(g[0], is_max ? gt(a, s) : lt(a, s), eq(a, s))};
  };
  d.save = {.inputs = {0}};
  return register_op(std::move(d));
}

const OpRef kMaximum = extremum("maximum", "kiln::math::maximum(a, b)", max_fn, true);
const OpRef kMinimum = extremum("minimum", "kiln::math::minimum(a, b)", min_fn, false);
const OpRef kMaximumScalar = extremum_scalar("maximum_scalar", "maximum", max_fn, true);
const OpRef kMinimumScalar = extremum_scalar("minimum_scalar", "minimum", min_fn, false);

// ---- where(cond, a, b) ----

DTypePlan where_dtypes(const OpArgs& a) {
  const DType c = a.inputs[0].dtype();
  if (c != DType::boolean)
    throw DTypeError("[where] the condition must be bool, got " + std::string(dtype_name(c)));
  ResultType r;
  r.add(a.inputs[1]).add(a.inputs[2]);
  const DType d = r.get();
  return {.inputs = {DType::boolean, d, d}, .outputs = {d}, .key = d};
}

void where_cpu(const OpArgs& a, std::span<Tensor> out) {
  const Tensor& y = out[0];
  const Shape& s = y.shape();
  const Tensor &c = a.inputs[0], &x0 = a.inputs[1], &x1 = a.inputs[2];
  const Shape sc = cpu::broadcast_strides(c.shape(), c.strides(), s);
  const Shape s0 = cpu::broadcast_strides(x0.shape(), x0.strides(), s);
  const Shape s1 = cpu::broadcast_strides(x1.shape(), x1.strides(), s);
  cpu::visit(y.dtype(), [&]<class T>() {
    const bool* pc = cpu::ptr<const bool>(c);
    const T* p0 = cpu::ptr<const T>(x0);
    const T* p1 = cpu::ptr<const T>(x1);
    T* py = cpu::ptr<T>(y);
    cpu::for_each_offset<4>(s, {&y.strides(), &sc, &s0, &s1}, {0, 0, 0, 0},
                            [&](const std::array<std::int64_t, 4>& o) { py[o[0]] = pc[o[1]] ? p0[o[2]] : p1[o[3]]; });
  });
}

const OpRef kWhere = register_op({
    .name = "where",
    .num_inputs = 3,
    .dtypes = dtype_sets::all,
    .dtype_rule = where_dtypes,
    .cpu = where_cpu,
    .gpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          const Shape& s = out[0].shape();
          kernels::launch_where(out[0].dtype(), gpu::operand(a.inputs[0], s), gpu::operand(a.inputs[1], s),
                                gpu::operand(a.inputs[2], s), gpu::operand(out[0]), s, stream_of(a.device));
        },
    .vjp = [](const VjpContext& c, G g) -> V {
      const Tensor cond = c.saved_input(0);
      V r(3);
      if (c.needs_grad(1)) r[1] = sum_to(where(cond, g[0], Scalar(0)), c.input(1).shape);
      if (c.needs_grad(2)) r[2] = sum_to(where(cond, Scalar(0), g[0]), c.input(2).shape);
      return r;
    },
    .save = {.inputs = {0}},
    // The generic gradcheck feeds a floating condition, which where refuses; tested by hand.
    .test = {.gradcheck = false, .inputs = {{.dtype = DType::boolean}}},
});

}  // namespace

Tensor pow(const Tensor& a, const Tensor& b) { return call(kPow, {a, b}); }
Tensor pow(const Tensor& a, const Scalar& b) { return call(kPowScalar, {a}, elementwise_defs::scalar_attrs(b)); }
Tensor pow(const Scalar& a, const Tensor& b) { return call(kRpowScalar, {b}, elementwise_defs::scalar_attrs(a)); }
Tensor maximum(const Tensor& a, const Tensor& b) { return call(kMaximum, {a, b}); }
Tensor maximum(const Tensor& a, const Scalar& b) { return call(kMaximumScalar, {a}, elementwise_defs::scalar_attrs(b)); }
Tensor minimum(const Tensor& a, const Tensor& b) { return call(kMinimum, {a, b}); }
Tensor minimum(const Tensor& a, const Scalar& b) { return call(kMinimumScalar, {a}, elementwise_defs::scalar_attrs(b)); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) { return call(kWhere, {cond, a, b}); }
// The scalar becomes a zero-dim tensor of the promoted dtype on a's device.
Tensor where(const Tensor& cond, const Tensor& a, const Scalar& b) {
  if (!a.defined()) throw ValueError("[where] input 1 is an undefined tensor");
  return where(cond, a, scalar_tensor(b, {.dtype = result_type(a, b), .device = a.device()}));
}
Tensor where(const Tensor& cond, const Scalar& a, const Tensor& b) {
  if (!b.defined()) throw ValueError("[where] input 2 is an undefined tensor");
  return where(cond, scalar_tensor(a, {.dtype = result_type(b, a), .device = b.device()}), b);
}

}  // namespace kiln
