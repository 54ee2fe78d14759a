#pragma once
// Compiled steps: a function of tensors captured once as a CUDA graph and replayed.
//
//   auto step = kiln::compile([&](const std::vector<kiln::Tensor>& in) {
//     opt.zero_grad();
//     kiln::Tensor loss = kiln::cross_entropy(net.forward(in[0]), in[1]);
//     loss.backward();
//     opt.step();
//     return std::vector<kiln::Tensor>{loss};
//   });
//   kiln::Tensor loss = step({x, y})[0];
//
// Per input signature (shapes, dtypes, devices, grad mode, the autocast dtype and CompileOptions::key), the
// first call (CompileOptions::warmup_calls) runs `fn` eagerly (kernels load, memory is sized), the next captures the same
// work into a CUDA graph and launches it, and later calls copy the inputs into the graph's
// static input buffers and launch the graph: the host does no work per op.
//
// Rules a compiled function follows:
// - Outputs are detached tensors in static buffers that the next call of the same signature
//   overwrites: copy (clone) what must outlive it.
// - Host code in `fn` runs only at the eager and the capturing call. What must change per
//   step lives on the device: the optimizer's step count, learning rate and bias corrections,
//   and the generator's (seed, offset); schedulers and optimizers stepped inside `fn` advance
//   their host state at every replay too, so a replay computes what eager would.
// - Inside a compiled function Optimizer::zero_grad() and Tensor::zero_grad() zero the
//   gradients in place instead of dropping them, and backward accumulates into the existing
//   .grad() storage, so gradients keep their buffers across steps.
// - Inside a capture, whatever needs the host throws a ValueError naming the op (item(),
//   to_host(), to(cpu), a tensor made from host data, an op on a CPU tensor, a kernel that the
//   eager call did not load); the capture is abandoned and the engine stays usable.
// - Objects `fn` uses (modules, optimizers, schedulers, generators) must outlive it, and one
//   thread at a time calls a compiled function. Ops on another device than the inputs' throw
//   inside a capture.
// On the CPU device (all inputs on the CPU) every call runs `fn` eagerly.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "device.h"
#include "tensor.h"

namespace kiln {

using StepFunction = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct CompileOptions {
  std::size_t max_graphs = 4;  // captured signatures kept, least recently used evicted first
  // Eager calls per signature before the capture: more when a function's first steps do work
  // its later steps do not (the capture can only use kernels an eager call loaded).
  int warmup_calls = 1;
  // Chains of pointwise ops of one shape (any dtypes, casts and tensor-scalar ops included) run
  // as one generated kernel; intermediate values nothing else holds are never written. Each op
  // rounds where its single kernel rounds, so a chain gives the single ops' bits; a whole
  // training step stays within f32 rounding of eager (docs/internals.md, "Fusion").
  bool fuse = true;
  // Host state that changes the work, joined into the signature (e.g. a module's train flag).
  std::function<std::string()> key{};
  // The device of a function without tensor inputs (otherwise the inputs' device).
  std::optional<Device> device{};
};

struct CompileStats {
  std::uint64_t eager_calls = 0;  // calls run eagerly: the first of each signature, and all on the CPU
  std::uint64_t captures = 0;
  std::uint64_t replays = 0;      // graph launches after the capturing call
  std::uint64_t evictions = 0;
  std::size_t graphs = 0;         // captured graphs held now
  std::vector<std::size_t> kernels_per_graph;  // kernel nodes of each held graph, most recent first
  std::vector<std::size_t> nodes_per_graph;    // all nodes (kernels, copies, memsets)
  std::vector<std::map<std::string, std::size_t>> kernel_names_per_graph;  // kernel nodes by function name
  // Edges on which a kernel is launched before the one it follows has finished
  // (rt::programmatic_launch).
  std::vector<std::size_t> programmatic_edges_per_graph;
  // The most kernels one path of each graph runs in turn: fewer than its kernels where weight
  // gradients run beside the backward's chain (kiln::set_weight_grad_stream).
  std::vector<std::size_t> kernel_chain_per_graph;
  // The kernels of that path of each graph by function name, in the order they run.
  std::vector<std::vector<std::string>> chain_kernels_per_graph;
  std::size_t bytes_held = 0;     // device memory the held graphs own (private pools, static inputs)
  // The most of it their values held at once while each was captured: the layout's floor.
  std::size_t bytes_live_peak = 0;
};

class CompiledFunction {
 public:
  CompiledFunction(StepFunction fn, CompileOptions options);
  ~CompiledFunction();  // waits for its last replay, then returns every graph and buffer
  CompiledFunction(CompiledFunction&&) noexcept;
  CompiledFunction& operator=(CompiledFunction&&) noexcept;
  CompiledFunction(const CompiledFunction&) = delete;
  CompiledFunction& operator=(const CompiledFunction&) = delete;

  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs);
  CompileStats stats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

CompiledFunction compile(StepFunction fn, CompileOptions options = {});

// True while this thread runs a compiled function's eager or capturing call.
bool in_compiled_call();
// True while this thread captures a compiled step.
bool capturing();

// Inside a compiled step's backward, weight gradients written straight into .grad() run on a
// second stream of the device, beside the input gradients the rest of the backward waits on,
// and the step waits for them where the backward ends: the same kernels, the same bits, a
// shorter chain. On by default (KILN_GRAD_STREAM=off turns it off); set before a capture.
void set_weight_grad_stream(bool on);
bool weight_grad_stream();

}  // namespace kiln
