// What the entry points of matmul, linear, conv2d, softmax and the losses do in an autocast
// scope (kiln/amp.h; the scope's state is in engine/core/amp_state.cpp).
#include "kiln/amp.h"

#include "kiln/ops.h"

namespace kiln {

Tensor autocast_lower(const Tensor& t) {
  const std::optional<DType> to = autocast_dtype();
  if (!to || !t.defined() || t.dtype() != DType::f32) return t;
  return cast(t, *to);
}

Tensor autocast_f32(const Tensor& t) {
  if (!autocast_dtype() || !t.defined() || (t.dtype() != DType::f16 && t.dtype() != DType::bf16)) return t;
  return cast(t, DType::f32);
}

}  // namespace kiln
