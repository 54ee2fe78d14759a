#pragma once
// Elementwise math, activations, comparisons and selection. Binary ops broadcast like
// NumPy and promote like PyTorch (kiln/dtype_promotion.h); floating functions (exp, log,
// sigmoid, pow...) turn integer and bool inputs into f32. f16/bf16 compute in f32.
// add/sub/mul/div/neg live in kiln/ops.h.
#include <optional>

#include "ops.h"
#include "scalar.h"
#include "tensor.h"

namespace kiln {

// ---- Unary ----
Tensor abs(const Tensor& x);
Tensor sign(const Tensor& x);  // sign(NaN) = 0 and sign(-0.0) = 0, as PyTorch
Tensor square(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor log1p(const Tensor& x);
Tensor expm1(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor erf(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);  // NaN stays NaN
// relu's gradient from its output y: g where y > 0, else 0 (one kernel).
Tensor relu_backward(const Tensor& g, const Tensor& y);
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);
Tensor gelu(const Tensor& x);      // exact: x * Phi(x), Phi through erf
Tensor silu(const Tensor& x);      // x * sigmoid(x)
Tensor softplus(const Tensor& x);  // log(1 + exp(x)); x itself above 20, as PyTorch
// Integer inputs come back unchanged (a copy); bool inputs are a DTypeError.
Tensor floor(const Tensor& x);
Tensor ceil(const Tensor& x);
Tensor round(const Tensor& x);  // half to even
Tensor logical_not(const Tensor& x);  // bool result, any input dtype
Tensor isnan(const Tensor& x);        // bool result; all false for integer inputs
// Either bound may be absent; NaN stays NaN; min > max gives max everywhere (torch.clamp).
// The bounds take part in type promotion like scalar operands (i32 clamped to 0.5 is f32).
Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max);

// ---- Binary (tensor-tensor with broadcasting, and tensor-scalar) ----
Tensor pow(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Scalar& b);
Tensor pow(const Scalar& a, const Tensor& b);
// NaN propagates; on ties the gradient is split evenly, as PyTorch.
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Scalar& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Scalar& b);

// Comparisons and logical ops: bool results, inputs promoted together first.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Scalar& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Scalar& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Scalar& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Scalar& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Scalar& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Scalar& b);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_and(const Tensor& a, const Scalar& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Scalar& b);

// cond ? a : b elementwise, broadcasting all three; cond must be bool (DTypeError
// otherwise); a and b are promoted together.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, const Scalar& b);
Tensor where(const Tensor& cond, const Scalar& a, const Tensor& b);

// Comparison operators give bool tensors (Tensor has no other equality).
inline Tensor operator==(const Tensor& a, const Tensor& b) { return eq(a, b); }
inline Tensor operator==(const Tensor& a, const Scalar& b) { return eq(a, b); }
inline Tensor operator!=(const Tensor& a, const Tensor& b) { return ne(a, b); }
inline Tensor operator!=(const Tensor& a, const Scalar& b) { return ne(a, b); }
inline Tensor operator<(const Tensor& a, const Tensor& b) { return lt(a, b); }
inline Tensor operator<(const Tensor& a, const Scalar& b) { return lt(a, b); }
inline Tensor operator<(const Scalar& a, const Tensor& b) { return gt(b, a); }
inline Tensor operator<=(const Tensor& a, const Tensor& b) { return le(a, b); }
inline Tensor operator<=(const Tensor& a, const Scalar& b) { return le(a, b); }
inline Tensor operator<=(const Scalar& a, const Tensor& b) { return ge(b, a); }
inline Tensor operator>(const Tensor& a, const Tensor& b) { return gt(a, b); }
inline Tensor operator>(const Tensor& a, const Scalar& b) { return gt(a, b); }
inline Tensor operator>(const Scalar& a, const Tensor& b) { return lt(b, a); }
inline Tensor operator>=(const Tensor& a, const Tensor& b) { return ge(a, b); }
inline Tensor operator>=(const Tensor& a, const Scalar& b) { return ge(a, b); }
inline Tensor operator>=(const Scalar& a, const Tensor& b) { return le(b, a); }

}  // namespace kiln
