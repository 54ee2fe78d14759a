// A compiled call's casts of its inputs, noted by its eager call and written by its capture's
// input copy (see input_casts.h).
#include "input_casts.h"

#include <cstdint>

#include "core/tensor/dispatch.h"
#include "kiln/creation.h"
#include "kiln/runtime/log.h"

namespace kiln::compile_detail {

struct CallInputs {
  const std::vector<Tensor>* inputs = nullptr;
  std::vector<std::uint64_t> versions;  // at the call's start: a cast after an in-place write is not the copy's
  std::vector<InputCast>* casts = nullptr;
  std::vector<bool> handed;  // capture: made[i] went to the step already
  bool capture = false;
};

namespace {

thread_local CallInputs* t_call = nullptr;

// The input t is all of, unchanged since the call began; -1 for none.
int input_of(const CallInputs& c, const Tensor& t) {
  if (!t.is_contiguous()) return -1;
  for (std::size_t i = 0; i < c.inputs->size(); ++i) {
    const Tensor& in = (*c.inputs)[i];
    if (in.data_ptr() == t.data_ptr() && in.dtype() == t.dtype() && in.numel() == t.numel() &&
        in.version() == c.versions[i])
      return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

kernels::CopyConvert copy_conversion(DType from, DType to) {
  if (from != DType::f32) return kernels::CopyConvert::none;
  if (to == DType::f16) return kernels::CopyConvert::f32_to_f16;
  if (to == DType::bf16) return kernels::CopyConvert::f32_to_bf16;
  return kernels::CopyConvert::none;
}

InputCastScope::InputCastScope(const std::vector<Tensor>& inputs, std::vector<InputCast>& casts, bool capture) {
  call_ = std::make_unique<CallInputs>();
  call_->inputs = &inputs;
  for (const Tensor& t : inputs) call_->versions.push_back(t.version());
  call_->casts = &casts;
  call_->handed.assign(casts.size(), false);
  call_->capture = capture;
  t_call = call_.get();
}

InputCastScope::~InputCastScope() { t_call = nullptr; }

std::optional<Tensor> input_cast(const Tensor& t, DType to) {
  if (!t_call || !t.defined() || t.requires_grad() || copy_conversion(t.dtype(), to) == kernels::CopyConvert::none)
    return std::nullopt;
  CallInputs& c = *t_call;
  const int input = input_of(c, t);
  if (input < 0) return std::nullopt;
  const auto i = static_cast<std::size_t>(input);
  for (std::size_t k = 0; k < c.casts->size(); ++k) {
    InputCast& cast = (*c.casts)[k];
    if (cast.input != i || cast.dtype != to) continue;
    if (!c.capture || c.handed[k] || !cast.made.defined()) return std::nullopt;  // noted already, or the step's own
    c.handed[k] = true;
    return cast.made.shape() == t.shape() ? cast.made : cast.made.reshape(t.shape());
  }
  if (c.capture) return std::nullopt;
  c.casts->push_back({.input = i, .dtype = to, .made = Tensor()});
  rt::log().debug("[compile] input {}'s cast to {}: the graph's input copy will write it", i, dtype_name(to));
  // Made here by the same kernel, so that the eager call's later ops (its fused groups) are
  // the capture's, whose kernels must all be loaded by then.
  Tensor out = empty(t.shape(), {.dtype = to, .device = t.device()});
  kernels::InputCopies copy;
  copy.dst[0] = device_address(out);
  copy.src[0] = device_address(t);
  copy.bytes[0] = static_cast<std::uint64_t>(t.numel()) * t.element_size();
  copy.convert[0] = copy_conversion(t.dtype(), to);
  copy.count = 1;
  kernels::launch_copy_inputs(copy, stream_of(t.device()));
  return out;
}

}  // namespace kiln::compile_detail
