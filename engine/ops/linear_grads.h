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

}  // namespace kiln::linear_detail
