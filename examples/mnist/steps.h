#pragma once
// The trainer's training and evaluation steps as functions of device tensors that never read
// a value on the host, so on a GPU they run as CUDA graphs (kiln::compile); --eager and the
// CPU call them directly.
#include <optional>
#include <string>
#include <vector>

#include <kiln/dist/grad_reducer.h>
#include <kiln/kiln.h>

namespace mnist {

// `fn` compiled when `compiled`, else called as it is; both run the same kernels.
class Step {
 public:
  Step(kiln::StepFunction fn, bool compiled, kiln::CompileOptions options = {});
  // Outputs of a compiled step live until its next call of the same shapes: accumulate or
  // clone them before that.
  std::vector<kiln::Tensor> operator()(const std::vector<kiln::Tensor>& inputs);
  std::optional<kiln::CompileStats> stats() const;  // nullopt when not compiled

 private:
  kiln::StepFunction fn_;
  std::optional<kiln::CompiledFunction> compiled_;
};

// (inputs (B, 784) normalised, labels (B) i64) -> {mean cross-entropy}: zero_grad, forward
// and loss (under autocast when set), backward of the loss as `scaler` scales it, the
// optimizer step through the scaler (skipped after inf/NaN gradients when it is enabled),
// then one step of `schedule` when there is one. With a `reducer` (data-parallel training) the
// gradients are averaged over the ranks before the optimizer step. `model`, `opt`, `schedule`,
// `scaler` and `reducer` must outlive the step.
Step train_step(kiln::nn::Module& model, kiln::optim::Optimizer& opt, kiln::optim::LrScheduler* schedule,
                bool compiled, std::optional<kiln::DType> autocast = std::nullopt,
                kiln::optim::GradScaler* scaler = nullptr, kiln::dist::GradReducer* reducer = nullptr);

// (inputs, labels) -> {summed cross-entropy, correct predictions (i64)}, without grad. The
// caller puts `model` in eval mode; its train flag is part of the compiled signature.
Step eval_step(kiln::nn::Module& model, bool compiled, std::optional<kiln::DType> autocast = std::nullopt);

// One line for the trainer's summary: captures, replays, kernels per graph, memory held.
std::string describe(const kiln::CompileStats& s);

}  // namespace mnist
