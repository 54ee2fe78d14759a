// The Tensor methods that run ops (kiln/tensor.h declares them with the rest): they live with
// the ops, so the tensor layer below calls nothing of engine/ops.
#include "core/registry.h"
#include "core/tensor/copy.h"
#include "kiln/creation.h"
#include "kiln/ops.h"

namespace kiln {

Tensor Tensor::to(DType t) const { return dtype() == t ? *this : cast(*this, t); }
Tensor Tensor::reshape(Shape s) const { return kiln::reshape(*this, s); }
Tensor Tensor::view(Shape s) const { return kiln::view(*this, s); }

Tensor& Tensor::fill_(const Scalar& s) {
  check_fits(s, dtype(), "fill_");
  if (inplace_needs_history(*this, {})) {
    check_inplace(*this, "[fill_] ");
    fill_into(*this, s);
    bump_version(*this);
    // The new values depend on nothing: a constant takes the place of the old history.
    rebase_history(*this, broadcast_to(scalar_tensor(s, {.dtype = dtype(), .device = device()}), shape()));
    return *this;
  }
  fill_into(*this, s);
  bump_version(*this);
  return *this;
}

Tensor& Tensor::zero_() { return fill_(0); }

Tensor& Tensor::copy_(const Tensor& src) {
  Tensor s = src.device() == device() ? src : src.to(device());
  const Tensor others[] = {s};
  if (inplace_needs_history(*this, others)) {
    check_inplace(*this, "[copy_] ");
    Tensor r = broadcast_to(s.to(dtype()), shape());
    copy_into(r.shares_storage(*this) ? convert(r, r.dtype()) : r, *this);
    bump_version(*this);
    rebase_history(*this, r);
    return *this;
  }
  Tensor tmp = s.shares_storage(*this) ? s.clone() : s;  // overlapping copies go through a temporary
  copy_into(tmp, *this);
  bump_version(*this);
  return *this;
}

}  // namespace kiln
