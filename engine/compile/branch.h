#pragma once
// Internal to the engine: inside a captured step, work that nothing on the main stream needs
// until the end of the backward pass (a layer's weight gradient, while the pass goes on to the
// layer below) runs on a second stream of the device. The capture records it as a parallel
// branch of the graph, joined back into the main stream at the end of the backward pass.
#include <functional>

#include "kiln/device.h"
#include "kiln/runtime/device.h"

namespace kiln::compile_detail {

// Creates the device's side stream and its cuBLAS workspace. Outside a capture only (the eager
// call of a compiled step), since a capture cannot allocate.
void prepare_branch_stream(Device d);
// Inside a capture, with the side stream prepared: runs `fn`, with stream_of(d) giving the side
// stream, after all work enqueued so far on the main stream. false: `fn` was not run.
bool run_branch(Device d, const std::function<void()>& fn);
// The main stream waits for every branch this thread opened.
void join_branches();
// The stream ops on `d` use while a branch runs; nullptr otherwise (stream_of consults it).
const rt::Stream* branch_stream(Device d);

}  // namespace kiln::compile_detail
