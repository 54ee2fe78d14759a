#pragma once
// Internal to engine/compile: the capture side of a compiled step (compiled_function.cpp drives
// it; the layers below reach it through core/step/step_state.h).
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>

#include "kiln/device.h"
#include "kiln/runtime/memory.h"
#include "kiln/tensor.h"
#include "core/step/step_state.h"

namespace kiln {
class Generator;
}

namespace kiln::rt {
class Graph;
}

namespace kiln::compile_detail {

struct CaptureContext;
extern thread_local CaptureContext* t_capture;  // non-null while this thread captures

using step::RngState;
using step::Words;

// The StepCompiler entries of the capture (capture.cpp).
Device capture_device();
void keep_alive(const Tensor& t);
void store_words(Device device, rt::DevicePtr dst, const Words& words, int count, std::function<Words()> refresh);
void on_replay(std::function<void()> action);
RngState rng_state(Generator& gen, Device device);

// Sets this thread's capture (nullptr ends it), keeping core's step state in step.
void set_capture(CaptureContext* c);

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
