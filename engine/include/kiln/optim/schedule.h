#pragma once
// Learning-rate schedules, counted in optimizer steps (the trainer steps once per batch):
// each step() sets the optimizer's lr for the next update, as PyTorch's schedulers do.
#include <cstdint>

#include "optimizer.h"

namespace kiln::optim {

class LrScheduler {
 public:
  // Sets the optimizer's lr to lr_at(0) at construction.
  explicit LrScheduler(Optimizer& opt) : opt_(opt) {}
  virtual ~LrScheduler() = default;
  void step();  // advances one step and sets lr_at(step)
  std::int64_t current_step() const { return step_; }
  void reset();  // back to step 0, setting lr_at(0); ValueError inside a capture
  // Jumps to `step` (>= 0) and sets lr_at(step), e.g. to continue a checkpointed run;
  // ValueError inside a capture or for a negative step.
  void set_step(std::int64_t step);
  virtual double lr_at(std::int64_t step) const = 0;

 protected:
  void start() { opt_.set_lr(lr_at(0)); }  // called by the constructors of subclasses

 private:
  void advance();
  Optimizer& opt_;
  std::int64_t step_ = 0;
};

// base_lr * gamma^(step / step_size).
class StepLR : public LrScheduler {
 public:
  StepLR(Optimizer& opt, double base_lr, std::int64_t step_size, double gamma = 0.1);
  double lr_at(std::int64_t step) const override;

 private:
  double base_lr_;
  std::int64_t step_size_;
  double gamma_;
};

// min_lr + (base_lr - min_lr) * (1 + cos(pi * step / total_steps)) / 2; min_lr after total_steps.
class CosineLR : public LrScheduler {
 public:
  CosineLR(Optimizer& opt, double base_lr, std::int64_t total_steps, double min_lr = 0.0);
  double lr_at(std::int64_t step) const override;

 private:
  double base_lr_;
  std::int64_t total_;
  double min_lr_;
};

// PyTorch's OneCycleLR (cosine annealing, three_phase = false): from max_lr/div_factor up
// to max_lr over pct_start of the steps, then down to max_lr/(div_factor*final_div_factor).
class OneCycleLR : public LrScheduler {
 public:
  OneCycleLR(Optimizer& opt, double max_lr, std::int64_t total_steps, double pct_start = 0.3,
             double div_factor = 25.0, double final_div_factor = 1e4);
  double lr_at(std::int64_t step) const override;

 private:
  double max_lr_;
  std::int64_t total_;
  double pct_start_, div_factor_, final_div_factor_;
};

}  // namespace kiln::optim
