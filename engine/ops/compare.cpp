// Comparisons (eq ne lt le gt ge), logical_and/or/not and isnan: bool results, not
// differentiable. Binary forms promote their inputs together (rules::compare) and have a
// tensor-scalar form "<op>_scalar"; scalar-first comparisons are the mirrored op.
#include "core/dtype_sets.h"
#include "elementwise_common.h"

namespace kiln {

namespace {

template <class F>
const OpDef& compare_op(const char* name, const char* expr, F f) {
  return register_op(elementwise_defs::binary_def<false, true>(name, dtype_sets::all, rules::compare, f,
                                                 {.expr = expr, .domain = elementwise_defs::PointwiseDomain::any_to_bool}));
}

template <class F>
const OpDef& compare_scalar_op(const char* name, const char* kernel, F f) {
  return register_op(
      elementwise_defs::binary_scalar_def<false, true>(name, kernel, false, dtype_sets::all, rules::compare, f));
}

// Compute types only: a and b already share the kernel's compute type.
auto eq_fn = [](auto a, auto b) { return a == b; };
auto ne_fn = [](auto a, auto b) { return a != b; };
auto lt_fn = [](auto a, auto b) { return a < b; };
auto le_fn = [](auto a, auto b) { return a <= b; };
auto gt_fn = [](auto a, auto b) { return a > b; };
auto ge_fn = [](auto a, auto b) { return a >= b; };
auto and_fn = [](auto a, auto b) { return a != decltype(a)(0) && b != decltype(b)(0); };
auto or_fn = [](auto a, auto b) { return a != decltype(a)(0) || b != decltype(b)(0); };

const OpDef& kEq = compare_op("eq", "a == b", eq_fn);
const OpDef& kNe = compare_op("ne", "a != b", ne_fn);
const OpDef& kLt = compare_op("lt", "a < b", lt_fn);
const OpDef& kLe = compare_op("le", "a <= b", le_fn);
const OpDef& kGt = compare_op("gt", "a > b", gt_fn);
const OpDef& kGe = compare_op("ge", "a >= b", ge_fn);
const OpDef& kAnd = compare_op("logical_and", "(a != C(0)) && (b != C(0))", and_fn);
const OpDef& kOr = compare_op("logical_or", "(a != C(0)) || (b != C(0))", or_fn);
const OpDef& kEqScalar = compare_scalar_op("eq_scalar", "eq", eq_fn);
const OpDef& kNeScalar = compare_scalar_op("ne_scalar", "ne", ne_fn);
const OpDef& kLtScalar = compare_scalar_op("lt_scalar", "lt", lt_fn);
const OpDef& kLeScalar = compare_scalar_op("le_scalar", "le", le_fn);
const OpDef& kGtScalar = compare_scalar_op("gt_scalar", "gt", gt_fn);
const OpDef& kGeScalar = compare_scalar_op("ge_scalar", "ge", ge_fn);
const OpDef& kAndScalar = compare_scalar_op("logical_and_scalar", "logical_and", and_fn);
const OpDef& kOrScalar = compare_scalar_op("logical_or_scalar", "logical_or", or_fn);

const OpDef& kLogicalNot = register_op(elementwise_defs::unary_def<false, true>(
    "logical_not", dtype_sets::all, elementwise_defs::to_bool_plan, [](auto x, double, double) { return x == decltype(x)(0); },
    {.expr = "x == C(0)", .domain = elementwise_defs::PointwiseDomain::any_to_bool}));

// Integer and bool inputs are never NaN: the GPU fills false instead of converting them.
const OpDef& kIsnan = register_op({
    .name = "isnan",
    .dtypes = dtype_sets::all,
    .dtype_rule = elementwise_defs::to_bool_plan,
    .cpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          elementwise_defs::cpu_unary<false, true>(a.inputs[0], out[0], [](auto x) { return x != x; });
        },
    .gpu =
        [k = gpu::LazyKernel("isnan")](const OpArgs& a, std::span<Tensor> out) {
          const DType t = a.inputs[0].dtype();
          if (is_floating(t))
            kernels::launch_unary(k.get(), t, DType::boolean, gpu::operand(a.inputs[0]), gpu::operand(out[0]),
                                  out[0].shape(), 0, 0, stream_of(a.device));
          else
            kernels::launch_fill(DType::boolean, gpu::operand(out[0]), out[0].shape(), kernels::Scalar(0),
                                 stream_of(a.device));
        },
    .pointwise = PointwiseExpr{.expr = "x != x", .domain = kernels::PointwiseDomain::floating_to_bool},
});

}  // namespace

Tensor eq(const Tensor& a, const Tensor& b) { return call(kEq, {a, b}); }
Tensor ne(const Tensor& a, const Tensor& b) { return call(kNe, {a, b}); }
Tensor lt(const Tensor& a, const Tensor& b) { return call(kLt, {a, b}); }
Tensor le(const Tensor& a, const Tensor& b) { return call(kLe, {a, b}); }
Tensor gt(const Tensor& a, const Tensor& b) { return call(kGt, {a, b}); }
Tensor ge(const Tensor& a, const Tensor& b) { return call(kGe, {a, b}); }
Tensor logical_and(const Tensor& a, const Tensor& b) { return call(kAnd, {a, b}); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return call(kOr, {a, b}); }
Tensor eq(const Tensor& a, const Scalar& b) { return call(kEqScalar, {a}, elementwise_defs::scalar_attrs(b)); }
Tensor ne(const Tensor& a, const Scalar& b) { return call(kNeScalar, {a}, elementwise_defs::scalar_attrs(b)); }
Tensor lt(const Tensor& a, const Scalar& b) { return call(kLtScalar, {a}, elementwise_defs::scalar_attrs(b)); }
Tensor le(const Tensor& a, const Scalar& b) { return call(kLeScalar, {a}, elementwise_defs::scalar_attrs(b)); }
Tensor gt(const Tensor& a, const Scalar& b) { return call(kGtScalar, {a}, elementwise_defs::scalar_attrs(b)); }
Tensor ge(const Tensor& a, const Scalar& b) { return call(kGeScalar, {a}, elementwise_defs::scalar_attrs(b)); }
Tensor logical_and(const Tensor& a, const Scalar& b) { return call(kAndScalar, {a}, elementwise_defs::scalar_attrs(b)); }
Tensor logical_or(const Tensor& a, const Scalar& b) { return call(kOrScalar, {a}, elementwise_defs::scalar_attrs(b)); }
Tensor logical_not(const Tensor& x) { return call(kLogicalNot, {x}); }
Tensor isnan(const Tensor& x) { return call(kIsnan, {x}); }

}  // namespace kiln
