#pragma once
// Optimizers update parameters in place on their device with no host synchronisation: on a
// GPU one fused launch updates up to 32 parameters of one dtype; parameters whose .grad() is
// undefined are skipped.
//   optim::Adam opt(net.parameters(), {.lr = 1e-3});
//   loss.backward(); opt.step(); opt.zero_grad();
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/nn/module.h"
#include "kiln/tensor.h"

namespace kiln::kernels {
struct SplitSums;
}

namespace kiln::optim {

// Elements [begin, begin + count) of parameter `index`, flattened; count -1: to its end.
struct ParamSpan {
  std::size_t index = 0;
  std::int64_t begin = 0, count = -1;
};

class Optimizer {
 public:
  // ValueError for an empty list, a parameter that is not a floating leaf requiring grad,
  // or the same tensor twice.
  Optimizer(std::vector<Tensor> params, double lr);
  // The most steps an optimizer takes: past 2^53 the step count is not exact as the double
  // that Adam's bias corrections raise beta to. step() beyond it is a ValueError.
  static constexpr std::int64_t kMaxSteps = std::int64_t{1} << 53;
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  void step();       // one update of every parameter that has a gradient
  // step() in parts: before(k) runs before the parameters parts[k] lists (indices into params())
  // are updated, e.g. a wait for the all-reduce that averaged their gradients, so a part's
  // updates start as soon as its gradients are ready (dist::GradReducer::finish(opt)); the
  // parameters in no part are updated last. Each parameter's update is step()'s, bit for bit.
  // ValueError for an index out of range or in two parts, before anything changes.
  void step_in_parts(const std::vector<std::vector<std::size_t>>& parts,
                     const std::function<void(std::size_t)>& before);
  // step_in_parts with parts of parameters' element spans, so one large parameter can be updated
  // piece by piece as its gradient's pieces are ready. A parameter in a part is covered whole by
  // its spans, with none overlapping; ValueError otherwise, before anything changes.
  void step_in_spans(const std::vector<std::vector<ParamSpan>>& parts, const std::function<void(std::size_t)>& before);
  // step() unless `found_inf` (an f32 scalar, GradScaler's) is nonzero; every parameter with a
  // gradient lives on its device (else DeviceError). On a GPU the update kernels read the flag,
  // so a captured step skips with no host read, but the step count advances either way (Adam's
  // bias corrections then count a skipped step); on the CPU a skipped step changes nothing.
  void step_unless(const Tensor& found_inf);
  void zero_grad();  // drops every parameter's .grad()
  // Back to step 0: every state slot zeroed in place and the step count 0, so a compiled step
  // captured before keeps its buffers and its next replay is a first step (e.g. after warming
  // up and capturing on real batches). ValueError inside a capture, and for SGD with momentum
  // and dampening, whose first step copies the gradient where a zeroed buffer would damp it.
  void reset_state();
  double lr() const { return lr_; }
  void set_lr(double lr);  // ValueError when negative or not finite
  std::int64_t steps() const { return steps_; }
  const std::vector<Tensor>& params() const { return params_; }

  // Per-parameter state named "<index>.<slot>" (e.g. "0.exp_avg") plus "step" (i64
  // scalar), for checkpoints. load_state checks names, dtypes, shapes, that step is in
  // [0, kMaxSteps] and that the state holds finite values (>= 0 where slot_nonnegative), and
  // throws ValueError listing every mismatch; nothing is changed unless all match.
  nn::NamedTensors state() const;
  void load_state(const nn::NamedTensors& state);

 protected:
  // Updates a span of a CPU parameter (count resolved) from its whole gradient (contiguous);
  // steps_ already counts this step.
  virtual void update(const ParamSpan& span, const Tensor& grad) = 0;
  // Updates every span (at most 32, of parameters on one CUDA device with one dtype; counts
  // resolved) from the whole gradients (contiguous, in the same order) with one launch.
  // sums[k], where not null (only for an optimizer that takes_split_sums(), and a whole
  // parameter): its gradient is that split's rows, which the launch sums into grads[k] and
  // updates from.
  virtual void update_gpu(const std::vector<ParamSpan>& spans, const std::vector<Tensor>& grads,
                          const std::vector<const kernels::SplitSums*>& sums) = 0;
  // Whether update_gpu sums a gradient given as a split's rows (a compiled step's held weight
  // gradients); else they are summed before the update, as the weight gradient would have.
  virtual bool takes_split_sums() const { return false; }
  // Called once per step before any update: a step may update a parameter in several spans.
  virtual void begin_step() {}
  // Slots this optimizer keeps per parameter ("momentum_buffer", "exp_avg", ...), created lazily.
  virtual std::vector<std::string> slot_names() const = 0;
  // What changes from step to step, as the GPU kernels read it (lr first); the base class
  // writes it to the device before the updates: a captured step's replays rewrite it.
  virtual std::vector<double> step_values() const { return {lr_}; }
  // The device address of step_values() for this step on `d` (written by step()).
  std::uint64_t step_values_on(Device d) const;
  // The device address of the flag the update kernels skip on (step_unless), 0: never skip.
  std::uint64_t skip_flag() const { return skip_flag_; }
  // Throws ValueError when zeroed state would not repeat a first step (reset_state).
  virtual void check_resettable() const {}
  // Whether a slot's values can never be negative (a second moment), for load_state's checks.
  virtual bool slot_nonnegative(std::size_t) const { return false; }
  // Zeros of the parameter's shape on first use (f32 for f16/bf16 parameters).
  Tensor& slot(std::size_t param, std::size_t slot);
  bool has_slot(std::size_t param, std::size_t slot) const;  // created or loaded already
  virtual std::string name() const { return "optim"; }       // the component in messages

 private:
  struct HeldSums;
  void advance();                 // checks the limit and counts one step
  void update_all(const std::vector<ParamSpan>& spans);
  // The gradients of `spans`' whole parameters that a compiled step left as a split's rows, for
  // their updates to sum; run_held_sums sums those no update took.
  void take_held_sums(const std::vector<ParamSpan>& spans);
  void run_held_sums() noexcept;
  // The held rows of parameter `index` for its update to sum (valid until the step ends), or null.
  const kernels::SplitSums* take_sums_of(std::size_t index);
  // Inside a captured step, right after its backward: the parameters whose gradients were final
  // before the last ones updated as soon as they were, beside the backward's last kernels, then
  // the rest. False (nothing done) where that does not apply.
  bool update_early(const std::vector<ParamSpan>& spans);
  // The step itself: parts[k] after before(k), the last part (the rest) last.
  void run_parts(const std::vector<std::vector<ParamSpan>>& parts, const std::function<void(std::size_t)>& before);
  // The spans checked and resolved (counts set) per part, then the parameters in no part whole.
  std::vector<std::vector<ParamSpan>> resolved(const std::vector<std::vector<ParamSpan>>& parts,
                                               const std::string& who) const;
  void write_step_values();       // to every CUDA device a parameter with a gradient lives on
  std::vector<Tensor> params_;
  std::vector<std::vector<Tensor>> slots_;
  std::vector<Tensor> step_buffers_;  // f64 [8] per CUDA device, indexed by ordinal
  double lr_;
  std::int64_t steps_ = 0;
  std::uint64_t skip_flag_ = 0;  // set during step_unless only
  std::vector<std::shared_ptr<HeldSums>> held_sums_;  // during a step only
};

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;  // needs momentum > 0 and dampening == 0
  double weight_decay = 0.0;  // L2: added to the gradient
};

// PyTorch's SGD: g += wd*p; b = momentum*b + (1-dampening)*g (b = g on the first step);
// g = nesterov ? g + momentum*b : b; p -= lr*g.
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SgdOptions options = {});

 protected:
  void update(const ParamSpan& span, const Tensor& grad) override;
  void update_gpu(const std::vector<ParamSpan>& spans, const std::vector<Tensor>& grads,
                  const std::vector<const kernels::SplitSums*>& sums) override;
  bool takes_split_sums() const override { return true; }
  std::vector<std::string> slot_names() const override;
  std::string name() const override { return "optim.SGD"; }
  void check_resettable() const override;
  void begin_step() override;

 private:
  // Whether this step made the parameter's momentum buffer: its later spans are first too.
  bool first_use(std::size_t param);
  SgdOptions o_;
  std::vector<bool> made_this_step_;
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // Adam: L2 added to the gradient; AdamW: decoupled
};

// m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2; p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps).
// f16/bf16 parameters keep f32 moments.
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options = {});

 protected:
  void update(const ParamSpan& span, const Tensor& grad) override;
  void update_gpu(const std::vector<ParamSpan>& spans, const std::vector<Tensor>& grads,
                  const std::vector<const kernels::SplitSums*>& sums) override;
  bool takes_split_sums() const override { return true; }
  std::vector<std::string> slot_names() const override;
  std::vector<double> step_values() const override;  // lr, 1 - beta1^t, 1 - beta2^t
  bool slot_nonnegative(std::size_t slot) const override { return slot == 1; }  // exp_avg_sq
  virtual bool decoupled() const { return false; }
  std::string name() const override { return decoupled() ? "optim.AdamW" : "optim.Adam"; }
  AdamOptions o_;
};

// Adam with decoupled weight decay: p *= 1 - lr*wd before the Adam update.
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamOptions options = {.weight_decay = 0.01});

 protected:
  bool decoupled() const override { return true; }
};

}  // namespace kiln::optim
