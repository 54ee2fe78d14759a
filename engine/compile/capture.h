#pragma once
// Internal to the engine: what ops, optimizers and generators do differently while a
// compiled step is being captured (engine/compile/compiled_function.cpp drives it).
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>

#include "kiln/device.h"
#include "kiln/runtime/memory.h"
#include "kiln/tensor.h"

namespace kiln {
class Generator;
}

namespace kiln::rt {
class Graph;
}

namespace kiln::compile_detail {

struct CaptureContext;
extern thread_local CaptureContext* t_capture;  // non-null while this thread captures
extern thread_local int t_compiled_calls;       // > 0 inside a compiled function's call
// Captures running in the process: eager ops (device_address on every launch) test this
// plain global first, sparing them the call a thread_local of a shared library costs.
extern std::atomic<int> g_captures;

inline bool capturing() { return g_captures.load(std::memory_order_relaxed) != 0 && t_capture != nullptr; }
inline bool in_compiled_call() { return t_compiled_calls > 0; }

// The device of this thread's capture (only while capturing).
Device capture_device();
// The graph reads or writes t's memory: keep it alive as long as the graph (no-op for a
// private-pool tensor, which the graph's pool owns already).
void keep_alive(const Tensor& t);
// ValueError "[op] ... needs the host ..." while capturing.
void require_host(const char* op, const char* what);

using Words = std::array<std::uint64_t, 8>;
// Writes words[0, count) to dst on the device's stream with a kernel. While capturing, the
// kernel is a node of the graph and `refresh` gives its words before every later replay.
void store_words(Device device, rt::DevicePtr dst, const Words& words, int count, std::function<Words()> refresh);
// Host work to redo before every later replay, in the order registered (e.g. a scheduler's step).
void on_replay(std::function<void()> action);

// A generator's (seed, offset) for random kernels inside a capture: the kernel reads the
// pair at `state` and adds its offset relative to `base`. Replays store the generator's
// current pair there and advance it by what the step draws.
struct RngState {
  rt::DevicePtr state = 0;
  std::uint64_t base = 0;
};
RngState rng_state(Generator& gen, Device device);

// Kernels the compiled function itself launches (engine/compile/step_io.cpp).
// Loads both before a capture, which cannot load modules.
void load_step_kernels(int device);
void launch_store_words(rt::DevicePtr dst, const Words& words, int count, const rt::Stream& s);
struct InputCopies {
  static constexpr int kMax = 8;
  std::uint64_t dst[kMax] = {}, src[kMax] = {}, bytes[kMax] = {};
  int count = 0;
};
void launch_copy_inputs(const InputCopies& copies, const rt::Stream& s);
// The argument arrays of those kernels, for rt::Graph::set_kernel_args.
void set_store_args(rt::Graph& g, void* node, rt::DevicePtr dst, const Words& words, int count);
void set_copy_args(rt::Graph& g, void* node, const InputCopies& copies);

}  // namespace kiln::compile_detail
