#pragma once
// User-defined pointwise ops: an expression over named tensors and scalar params, run by
// the same generated elementwise kernels as the built-in ops (and evaluated on the host for
// CPU tensors).
//
//   Tensor y = pointwise("swish", "x * sigmoid(beta * x)", {x},
//                        {.params = {{"beta", 1.0}},
//                         .grads = {"g * (sigmoid(beta*x) * (1 + beta*x*(1 - sigmoid(beta*x))))"}});
//
// The language: numbers, the input and param names, + - * / (unary - and +), comparisons
// < <= > >= == != (1 or 0), parentheses, and the functions exp log log1p expm1 sqrt rsqrt
// sin cos tanh erf floor ceil rint abs sign relu sigmoid silu gelu softplus (one argument)
// and pow maximum minimum (two). Inputs are promoted together; integers compute in f32;
// f32, f16 and bf16 compute in float, f64 in double, as the built-in ops do. Two inputs
// broadcast. The first call registers the op under `name` (kernels compile once and go to
// the disk cache); later calls must give the same expression, input names, param names and
// gradients (ValueError otherwise) but may change the param values.
#include <string>
#include <vector>

#include "kiln/error.h"
#include "tensor.h"

namespace kiln {

struct PointwiseParam {
  std::string name;
  double value = 0;
};

struct PointwiseOptions {
  // The inputs' names in the expression; empty: "x" for one input, "a", "b" for two.
  std::vector<std::string> inputs{};
  // At most two (they travel to the kernel as its p0, p1); values may differ per call.
  std::vector<PointwiseParam> params{};
  // Empty, or one expression per input: d(output)/d(input) times the incoming gradient,
  // over the inputs, the output `y`, the incoming gradient `g` and the params. Without
  // them the op is not differentiable: calling it on an input that requires grad (with
  // grad mode on) is a ValueError. Gradients of gradients are not supported.
  std::vector<std::string> grads{};
};

// Runs the op `name` (a C identifier) on one or two tensors, registering it on first use.
// Names "y" and "g" are reserved for gradients; names must differ from the functions'.
Tensor pointwise(const std::string& name, const std::string& expr, const std::vector<Tensor>& inputs,
                 const PointwiseOptions& options = {});

// A syntax error or unknown name in a pointwise expression. what() reads
// `[pointwise swish] expected ')' at column 21 in "x * sigmoid(beta * x"`.
class ExpressionError : public CompileError {
 public:
  ExpressionError(const std::string& op, const std::string& what, int column, const std::string& expression);
  const char* what() const noexcept override { return message_.c_str(); }
  int column() const { return column_; }  // 1-based
  const std::string& expression() const { return expression_; }

 private:
  std::string message_, expression_;
  int column_;
};

}  // namespace kiln
