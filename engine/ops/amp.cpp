// The autocast scope: one thread-local dtype that the entry points of matmul, linear, conv2d,
// softmax and the losses consult (kiln/amp.h).
#include "kiln/amp.h"

#include <string>

#include "kiln/error.h"
#include "kiln/ops.h"

namespace kiln {

namespace {
thread_local std::optional<DType> t_autocast;
}  // namespace

std::optional<DType> autocast_dtype() { return t_autocast; }

AutocastGuard::AutocastGuard(std::optional<DType> dtype) : prev_(t_autocast) {
  if (dtype && *dtype != DType::f16 && *dtype != DType::bf16)
    throw DTypeError("[autocast] the autocast dtype must be f16 or bf16, got " + std::string(dtype_name(*dtype)));
  t_autocast = dtype;
}

AutocastGuard::~AutocastGuard() { t_autocast = prev_; }

Tensor autocast_lower(const Tensor& t) {
  if (!t_autocast || !t.defined() || t.dtype() != DType::f32) return t;
  return cast(t, *t_autocast);
}

Tensor autocast_f32(const Tensor& t) {
  if (!t_autocast || !t.defined() || (t.dtype() != DType::f16 && t.dtype() != DType::bf16)) return t;
  return cast(t, DType::f32);
}

}  // namespace kiln
