#pragma once
// Matrix products: matmul with torch.matmul's 1-D/2-D/N-D semantics (batch dims
// broadcast), and linear = x @ w^T + b. GPU through cuBLAS, CPU through the blocked GEMM.
#include "tensor.h"

namespace kiln {

// a (.., m, k) @ b (.., k, n) -> (.., m, n); a 1-D `a` is a row vector and a 1-D `b` a
// column vector, their dim removed from the result. f32, f64, f16, bf16 (f16/bf16
// accumulate in f32). Transposed views go to cuBLAS without a copy.
Tensor matmul(const Tensor& a, const Tensor& b);

enum class Activation { none, relu };

// x (.., in) @ w^T with w (out, in), plus bias (out) when defined, then the activation. With a
// bias, on the GPU, one cuBLASLt product adds the bias and applies the ReLU in its epilogue, and
// the backward pass takes the bias gradient in the weight gradient's epilogue (f32, f16, bf16;
// f64 runs the same math as separate kernels). nn::Sequential uses it for Linear then ReLU.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor(), Activation activation = Activation::none);

// The weight and bias gradients of linear, from gp (m, out), the gradient of its output before
// the activation, and its input x (m, in): gp^T @ x (out, in) and gp's column sums (out). On the
// GPU (f32, f16, bf16) one cuBLASLt product takes both, as the backward pass does; elsewhere a
// matmul and a sum. The results record no autograd history.
struct LinearGrads {
  Tensor weight, bias;
};
LinearGrads linear_grads(const Tensor& gp, const Tensor& x);

// f32 matmuls on the GPU may use TF32 tensor cores (about 10 mantissa bits): opt-in,
// process-wide, off by default.
void set_allow_tf32(bool allow);
bool allow_tf32();

}  // namespace kiln
