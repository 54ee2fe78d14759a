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
#include "backend/cuda/generated/step_io/step_io_kernels.h"

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
void store_words(const Tensor& dst, const Words& words, int count, std::function<Words()> refresh);
void on_replay(std::function<void()> action);
RngState rng_state(Generator& gen, Device device);

// Sets this thread's capture (nullptr ends it), keeping core's step state in step.
void set_capture(CaptureContext* c);

}  // namespace kiln::compile_detail
