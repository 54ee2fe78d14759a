#pragma once
// linear's backward (linear_grads.cpp) and the cuBLASLt operand views it shares with the
// forward (linear.cpp).
#include <cstdint>
#include <vector>

#include "core/registry.h"
#include "kiln/tensor.h"

namespace kiln::linear_detail {

// A (rows, cols) operand as cuBLASLt reads it: column-major storage with a leading dimension,
// transposed or not. Unit stride along the columns of the row-major view, or along its rows.
struct LtOperand {
  bool ok = false, trans = false;
  std::int64_t ld = 0;
};
LtOperand lt_operand(const Tensor& t);
// t itself when cuBLASLt can read it, else a contiguous copy.
Tensor lt_ready(const Tensor& t);

// Gradients {dx, dW, db} of linear(x, W, b) (with ReLU when `relu`, y its saved output) from g,
// the gradient of y.
std::vector<Tensor> linear_vjp(const VjpContext& c, const Tensor& g, bool relu);

// An output layer's input gradient made ahead of the backward: the fused product and loss
// (cross_entropy.cpp) write dx = (dlogits @ w) masked for the ReLU that made y beside the loss's
// gradient for a backward() of 1, and offer it here; the layer's vjp takes it, once, where its
// incoming gradient is that dlogits (the same storage) and its operands w and y are those
// addresses, instead of launching its own product. One offer at a time per thread; a later one
// replaces it, and it holds dlogits only weakly.
void offer_ahead_input_grad(const Tensor& dlogits, std::uint64_t w, std::uint64_t y, Tensor dx);
Tensor take_ahead_input_grad(const Tensor& g, const Tensor& w, const Tensor& y);  // undefined if none fits
Tensor peek_ahead_input_grad(const Tensor& g, const Tensor& w, const Tensor& y);  // the same, left in place
// The bias gradient of the layer below an output layer, made ahead: the output layer's narrow
// weight-gradient kernel sums the columns of the masked input gradient it hands down (`below`,
// made ahead as above) into the grad sink that the layer below's vjp will find for its bias
// (VjpContext::producer_sink), and offers it here; that vjp takes it, once, where its gp is
// `below` (the same storage, address, shape and version), and runs its weight product alone.
void offer_ahead_bias_grad(const Tensor& below, Tensor db);
Tensor take_ahead_bias_grad(const Tensor& gp);  // undefined if none fits
std::int64_t ahead_bias_grads_taken();          // since the process started (tests)
// Whether the row input-gradient kernel's arithmetic (exact f32 sums) serves a product in t: 16-bit
// dtypes, and f32 unless TF32 is allowed (TF32 products stay on cuBLASLt's TF32 kernels).
bool row_input_grad_serves(DType t);
// Whether input `i` of the op that made `out` is the one output of an op whose gradient a ReLU
// masks (a linear layer with ReLU, relu): a gradient masked ahead may then serve its vjp
// (VjpContext::may_mask_input_gradient says whether it will, in the backward).
bool relu_made_input(const Tensor& out, int i);

}  // namespace kiln::linear_detail
