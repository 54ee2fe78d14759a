#pragma once
// Launchers of the elementwise templates (elementwise_unary.cu, elementwise_binary.cu, fill.cu,
// where.cu) and the specs of pointwise ops. Dtype tuples: (in, out) for unary, binary and
// cast; (t) for fill and where.
#include <span>
#include <string>
#include <vector>

#include "launch_common.h"

namespace kiln::kernels {

// Which (input, output) tuples a pointwise op's kernel is instantiated for.
enum class PointwiseDomain {
  numeric,           // (t, t), t in f32 f64 f16 bf16 i32 i64 u8
  floating,          // (t, t), t in f32 f64 f16 bf16
  any_to_bool,       // (t, bool), every dtype
  floating_to_bool,  // (t, bool), t floating
  all_pairs,         // (t, u), every pair of dtypes (cast)
};
std::vector<DTypes> pointwise_tuples(PointwiseDomain domain);

// Registers the spec `op` of the unary (arity 1) or binary (arity 2) elementwise template
// with `expr` bound to ${OP}; register_op calls this for every OpDef with a pointwise expr.
// Variants: 0 contiguous, 1 strided, and for binary ops 2 with a host scalar.
const rt::KernelSpec& register_pointwise_kernel(const std::string& op, int arity, const std::string& expr,
                                                PointwiseDomain domain);

// y = op(x; p0, p1) (p0/p1: leaky_relu slope, clamp bounds; ignored by other ops).
void launch_unary(const rt::KernelSpec& spec, DType in, DType out, const Operand& x, const Operand& y,
                  std::span<const std::int64_t> shape, double p0, double p1, const rt::Stream& s);
// y = op(a, b; p0, p1); a and b share the input dtype (p0/p1: user pointwise params).
void launch_binary(const rt::KernelSpec& spec, DType in, DType out, const Operand& a, const Operand& b,
                   const Operand& y, std::span<const std::int64_t> shape, const rt::Stream& s, double p0 = 0,
                   double p1 = 0);
// y = op(scalar, a) when scalar_first, else op(a, scalar). The scalar converts to the
// input's compute type (float for f16/bf16).
void launch_binary_scalar(const rt::KernelSpec& spec, DType in, DType out, const Operand& a, Scalar scalar,
                          bool scalar_first, const Operand& y, std::span<const std::int64_t> shape,
                          const rt::Stream& s);
// y = x converted to `out`; with in == out this is the strided copy (contiguous(), views).
void launch_cast(DType in, DType out, const Operand& x, const Operand& y, std::span<const std::int64_t> shape,
                 const rt::Stream& s);
void launch_fill(DType t, const Operand& y, std::span<const std::int64_t> shape, Scalar value,
                 const rt::Stream& s);
// y = cond ? a : b; cond is bool, a, b and y are `t`.
void launch_where(DType t, const Operand& cond, const Operand& a, const Operand& b, const Operand& y,
                  std::span<const std::int64_t> shape, const rt::Stream& s);

}  // namespace kiln::kernels
