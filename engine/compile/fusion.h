#pragma once
// Internal to the engine: inside a compiled call on the GPU, chains of pointwise ops of one
// shape (any dtypes, casts and tensor-scalar ops included) are held back and run as one
// generated kernel when something needs their values. Values nothing else holds are never
// written.
#include <functional>
#include <optional>
#include <span>

#include "core/step/step_state.h"
#include "kiln/device.h"
#include "kiln/tensor.h"

namespace kiln {
struct OpDef;
struct OpArgs;
}  // namespace kiln

namespace kiln::compile_detail {

struct Fusion;
extern thread_local Fusion* t_fusion;  // set for the duration of a compiled call on a GPU

// Holds the op back when it can join the pending group (flushing the group first when it
// cannot join it); false: the caller runs it now.
bool defer_pointwise(const OpDef& op, const OpArgs& args, std::span<Tensor> outputs);
// op, which defer_pointwise declined, has run (`finished`) or thrown: logged, and listed in a
// kernel plan's step unless it ran inside another op.
void ran_alone(const OpDef& op, std::span<const Tensor> outputs, bool finished) noexcept;
// t is about to be read or written by other work: run the pending group if it involves t, a
// held product whatever t is, and the held sums that write t's storage.
void before_use(const Tensor& t);
// before_use, but held sums that write exactly t stay held, to call after_run should they run.
void before_ready(const Tensor& t, std::function<void()> after_run);
bool holds(const Tensor& t);  // whether held sums write exactly t
// step::StepCompiler's hold_product and take_held: one product at a time, held until any
// address is taken (every launch takes its operands' first: ops held back as a pointwise group
// take none, so a cast of the labels on the way to the loss does not end it) or the call ends.
bool hold_product(step::HeldProduct p);
std::optional<step::HeldProduct> take_held(const Tensor& t);
// step::StepCompiler's hold_sums and take_sums: any number, each held until its output's
// storage is used or the call ends.
bool hold_sums(step::HeldProduct p);
std::optional<step::HeldProduct> take_sums(const Tensor& t);

// Turns fusion on for the calling thread while alive (nested scopes are no-ops).
class FusionScope {
 public:
  explicit FusionScope(Device device);
  ~FusionScope();  // drops what is pending when unwinding from an exception
  FusionScope(const FusionScope&) = delete;
  FusionScope& operator=(const FusionScope&) = delete;
  void finish();  // flushes; call before the results are used

 private:
  Fusion* own_ = nullptr;
};

}  // namespace kiln::compile_detail
