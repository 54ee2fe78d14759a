#pragma once
// User pointwise ops (kiln/pointwise.h) shared by the engine (CPU) and GPU suites, so both
// register the same definitions.
#include <string>

#include "kiln/kiln.h"

namespace kiln_test {

inline kiln::Tensor swish(const kiln::Tensor& x, double beta) {
  return kiln::pointwise(
      "swish", "x * sigmoid(beta * x)", {x},
      {.params = {{"beta", beta}}, .grads = {"g * (sigmoid(beta*x) * (1 + beta*x*(1 - sigmoid(beta*x))))"}});
}

// a + w (b - a) + c a b: two params on a binary op.
inline kiln::Tensor mix(const kiln::Tensor& a, const kiln::Tensor& b, double w, double c) {
  return kiln::pointwise("mix", "a + w * (b - a) + c * a * b", {a, b},
                         {.params = {{"w", w}, {"c", c}}, .grads = {"g * (1 - w + c * b)", "g * (w + c * a)"}});
}

// db reads a, b and g: three tensors, so it runs as steps.
inline kiln::Tensor ratio(const kiln::Tensor& a, const kiln::Tensor& b) {
  return kiln::pointwise("ratio", "a / b", {a, b}, {.grads = {"g / b", "-g * a / (b * b)"}});
}

}  // namespace kiln_test
