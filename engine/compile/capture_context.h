#pragma once
// Internal to engine/compile: what a capture collects while `fn` runs.
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "capture.h"
#include "core/step/step_state.h"
#include "kiln/runtime/device.h"

namespace kiln::compile_detail {

// A generator drawn from inside the capture.
struct CapturedRng {
  Generator* gen = nullptr;
  int device = -1;
  Tensor state;                // u64 [2] holding (seed, offset) on the device
  std::uint64_t seed = 0;      // at the capture
  std::uint64_t base = 0;      // its offset when the capture first drew from it
  std::shared_ptr<std::uint64_t> blocks = std::make_shared<std::uint64_t>(0);  // drawn per step
};

using ReplayAction = std::function<void(rt::Graph&)>;

struct CaptureContext {
  Device device;
  const rt::Stream* stream = nullptr;
  std::unordered_map<const void*, std::shared_ptr<const void>> kept{};  // storages the graph uses
  std::vector<ReplayAction> actions{};
  std::vector<CapturedRng> rngs{};
  // The first input copy's arguments, whose word stores store_words fills; null without inputs.
  std::shared_ptr<kernels::InputCopies> input_copy{};
};

// RAII for the thread's compiled-call depth.
struct CompiledCall {
  CompiledCall() { ++step::t_compiled_calls; }
  ~CompiledCall() { --step::t_compiled_calls; }
};

}  // namespace kiln::compile_detail
