#pragma once
// A compiled step as the layers below engine/compile see it: whether this thread captures a
// CUDA graph or fuses pointwise chains, and what ops, optimizers and generators do differently
// then. engine/compile implements StepCompiler and installs it when the library loads; core
// only asks and forwards, so nothing here includes engine/compile.
#include <any>
#include <array>
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <span>

#include "backend/cuda/generated/step_io/step_io_kernels.h"
#include "kiln/device.h"
#include "kiln/runtime/memory.h"
#include "kiln/tensor.h"

namespace kiln {
class Generator;
struct OpDef;
struct OpArgs;
}  // namespace kiln

namespace kiln::step {

using Words = kernels::StepWords;  // what the step I/O kernels store

// A generator's (seed, offset) for random kernels inside a capture: the kernel reads the
// pair at `state` and adds its offset relative to `base`.
struct RngState {
  rt::DevicePtr state = 0;
  std::uint64_t base = 0;
};

// A product an op held back for the op after it to fuse with: `output` is what it writes, run()
// launches it alone, and `fused` describes it to a consumer that knows the type (an output
// layer's product, kernels::RowProduct, to the cross-entropy over its rows). With `ran` the
// product has run already (its choice was measured in this call, or a shape-only pass planned
// it): the consumer runs apart and only loads its fused kernel, for the capture to launch. Split
// sums held for the step's update (hold_sums) are HeldProducts too, their fused part the
// kernels::SplitSums.
struct HeldProduct {
  Tensor output;
  std::function<void()> run;
  std::any fused;
  bool ran = false;
  std::function<void()> after_run = {};  // held sums: called once run() has run (not when taken)
};

// What engine/compile does for the layers below it.
class StepCompiler {
 public:
  virtual ~StepCompiler() = default;
  // The device of this thread's capture (only while capturing).
  virtual Device capture_device() = 0;
  // The graph reads or writes t's memory: keep it alive as long as the graph.
  virtual void keep_alive(const Tensor& t) = 0;
  // Writes words[0, count) to dst (at least count u64) on its device's stream with a kernel.
  // While capturing, the store is part of the graph (a node of its own, or the input copy at
  // its head when dst outlives the capture's pool) and `refresh` gives its words before every
  // later replay.
  virtual void store_words(const Tensor& dst, const Words& words, int count, std::function<Words()> refresh) = 0;
  // Host work to redo before every later replay, in the order registered.
  virtual void on_replay(std::function<void()> action) = 0;
  // Replays store the generator's current pair at the returned state and advance it by what
  // the step draws.
  virtual RngState rng_state(Generator& gen, Device device) = 0;
  // Holds a pointwise op back when it can join the pending fused group; false: run it now.
  virtual bool defer_pointwise(const OpDef& op, const OpArgs& args, std::span<Tensor> outputs) = 0;
  // op, which defer_pointwise declined, has run (`finished`) or thrown.
  virtual void ran_alone(const OpDef& op, std::span<const Tensor> outputs, bool finished) noexcept = 0;
  // t is about to be read or written by other work: run the pending group if it involves t, a
  // held product whatever t is, and the held sums that write t's storage.
  virtual void before_use(const Tensor& t) = 0;
  // before_use for a gradient that became final, except that held sums writing exactly t stay
  // held, with `after_run` to call should they run after all: the step's update takes them
  // (take_sums).
  virtual void before_ready(const Tensor& t, std::function<void()> after_run) = 0;
  // Whether held sums write exactly t.
  virtual bool holds(const Tensor& t) = 0;
  // Holds p until the next address taken (by any launch) or the call's end, for the op after it
  // to take (take_held); false where this thread fuses nothing, or on another device: the caller
  // runs it.
  virtual bool hold_product(HeldProduct p) = 0;
  // The held product when it writes exactly t (same storage, offset, shape and strides): taken,
  // so the caller runs it or its fused form. Else the held product runs, and nullopt.
  virtual std::optional<HeldProduct> take_held(const Tensor& t) = 0;
  // Holds p, a split's sums into a gradient (its fused part the kernels::SplitSums), until
  // other work uses its output's storage or the call ends, whatever else launches meanwhile;
  // false where this thread fuses nothing, or on another device: the caller runs it.
  virtual bool hold_sums(HeldProduct p) = 0;
  // The held sums that write exactly t, taken (the caller makes them), or nullopt.
  virtual std::optional<HeldProduct> take_sums(const Tensor& t) = 0;
  // The step casts t to `to`, and t is all of one of the compiled call's inputs, unchanged: the
  // cast as the graph's input copy writes it (an eager call notes it and makes it with the
  // same kernel); nullopt where the step's own cast runs.
  virtual std::optional<Tensor> input_cast(const Tensor& t, DType to) = 0;
  // index_select(source, 0, index) where index is all of one of the call's inputs, unchanged:
  // the rows as the graph's input copy gathers them (an eager call notes the gather and makes it
  // with the same kernel); nullopt where the step's own gather runs.
  virtual std::optional<Tensor> input_gather(const Tensor& source, const Tensor& index) = 0;
};

// engine/compile installs its StepCompiler once, while the library loads.
void install(StepCompiler& compiler);
StepCompiler& compiler();  // Error when none is installed

// Written by engine/compile. Eager ops test the plain globals first, sparing them the call a
// thread_local of a shared library costs.
extern std::atomic<int> g_captures;        // captures running in the process
extern std::atomic<int> g_fusions;         // threads with pointwise fusion on
extern thread_local bool t_capturing;      // this thread captures a step
extern thread_local int t_compiled_calls;  // > 0 inside a compiled function's call

inline bool capturing() { return g_captures.load(std::memory_order_relaxed) != 0 && t_capturing; }
inline bool fusing() { return g_fusions.load(std::memory_order_relaxed) != 0; }
inline bool in_compiled_call() { return t_compiled_calls > 0; }

// ValueError "[op] ... needs the host ..." while capturing.
void require_host(const char* op, const char* what);

inline Device capture_device() { return compiler().capture_device(); }
inline void keep_alive(const Tensor& t) { compiler().keep_alive(t); }
inline void store_words(const Tensor& dst, const Words& words, int count, std::function<Words()> refresh) {
  compiler().store_words(dst, words, count, std::move(refresh));
}
inline void on_replay(std::function<void()> action) { compiler().on_replay(std::move(action)); }
inline RngState rng_state(Generator& gen, Device device) { return compiler().rng_state(gen, device); }
inline bool defer_pointwise(const OpDef& op, const OpArgs& args, std::span<Tensor> outputs) {
  return fusing() && compiler().defer_pointwise(op, args, outputs);
}
inline void before_use(const Tensor& t) {
  if (fusing()) compiler().before_use(t);
}
inline void before_ready(const Tensor& t, std::function<void()> after_run) {
  if (fusing()) compiler().before_ready(t, std::move(after_run));
}
inline bool holds(const Tensor& t) { return fusing() && compiler().holds(t); }
inline bool hold_product(HeldProduct p) { return fusing() && compiler().hold_product(std::move(p)); }
inline std::optional<HeldProduct> take_held(const Tensor& t) {
  return fusing() ? compiler().take_held(t) : std::nullopt;
}
inline bool hold_sums(HeldProduct p) { return fusing() && compiler().hold_sums(std::move(p)); }
inline std::optional<HeldProduct> take_sums(const Tensor& t) {
  return fusing() ? compiler().take_sums(t) : std::nullopt;
}
// Around an op defer_pointwise declined: tells the compiler once it has run, thrown or not.
class RunAlone {
 public:
  RunAlone(const OpDef& op, std::span<const Tensor> outputs)
      : op_(op), outputs_(outputs), exceptions_(std::uncaught_exceptions()) {}
  ~RunAlone() {
    if (fusing()) compiler().ran_alone(op_, outputs_, std::uncaught_exceptions() == exceptions_);
  }
  RunAlone(const RunAlone&) = delete;
  RunAlone& operator=(const RunAlone&) = delete;

 private:
  const OpDef& op_;
  std::span<const Tensor> outputs_;
  int exceptions_;
};
inline std::optional<Tensor> input_cast(const Tensor& t, DType to) {
  if (!in_compiled_call()) return std::nullopt;
  return compiler().input_cast(t, to);
}
inline std::optional<Tensor> input_gather(const Tensor& source, const Tensor& index) {
  if (!in_compiled_call()) return std::nullopt;
  return compiler().input_gather(source, index);
}

}  // namespace kiln::step
