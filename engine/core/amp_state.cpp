// The autocast scope: one thread-local dtype (kiln/amp.h). The ops that consult it live in
// engine/ops/amp.cpp; the state is core's, since autograd turns it off for the backward.
#include <optional>
#include <string>

#include "kiln/amp.h"
#include "kiln/error.h"

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

}  // namespace kiln
