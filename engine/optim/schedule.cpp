// Learning-rate schedules as closed forms of the step, matching PyTorch's StepLR,
// CosineAnnealingLR (held at min_lr after the end) and OneCycleLR (cos, two phases).
#include "kiln/optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "core/step/step_state.h"
#include "kiln/error.h"
#include "optim_common.h"

namespace kiln::optim {

namespace {

using detail::kInf;

void check_positive_steps(const char* who, const char* what, std::int64_t n) {
  if (n <= 0) throw ValueError("[" + std::string(who) + "] " + what + " must be > 0, got " + std::to_string(n));
}

void check_step(const char* who, std::int64_t step) {
  if (step < 0) throw ValueError("[" + std::string(who) + "] step must be >= 0, got " + std::to_string(step));
}

// PyTorch's _annealing_cos: from start (pct 0) to end (pct 1) along half a cosine.
double anneal_cos(double start, double end, double pct) {
  const double cos_out = std::cos(std::numbers::pi * pct) + 1;
  return end + (start - end) / 2.0 * cos_out;
}

}  // namespace

void LrScheduler::step() {
  advance();
  // Inside a captured step the host's part must also run at every replay.
  step::on_replay([this] { advance(); });
}

void LrScheduler::reset() {
  if (step::capturing()) throw ValueError("[optim.LrScheduler] reset inside a compiled step's capture");
  step_ = 0;
  start();
}

void LrScheduler::set_step(std::int64_t step) {
  if (step::capturing()) throw ValueError("[optim.LrScheduler] set_step inside a compiled step's capture");
  check_step("optim.LrScheduler", step);
  step_ = step;
  opt_.set_lr(lr_at(step_));
}

void LrScheduler::advance() {
  ++step_;
  opt_.set_lr(lr_at(step_));
}

StepLR::StepLR(Optimizer& opt, double base_lr, std::int64_t step_size, double gamma)
    : LrScheduler(opt), base_lr_(base_lr), step_size_(step_size), gamma_(gamma) {
  detail::check_range("optim.StepLR", "base_lr", base_lr, 0, false, kInf, false);
  check_positive_steps("optim.StepLR", "step_size", step_size);
  detail::check_range("optim.StepLR", "gamma", gamma, 0, false, kInf, false);
  start();
}

double StepLR::lr_at(std::int64_t step) const {
  check_step("optim.StepLR", step);
  return base_lr_ * std::pow(gamma_, static_cast<double>(step / step_size_));
}

CosineLR::CosineLR(Optimizer& opt, double base_lr, std::int64_t total_steps, double min_lr)
    : LrScheduler(opt), base_lr_(base_lr), total_(total_steps), min_lr_(min_lr) {
  detail::check_range("optim.CosineLR", "base_lr", base_lr, 0, false, kInf, false);
  check_positive_steps("optim.CosineLR", "total_steps", total_steps);
  detail::check_range("optim.CosineLR", "min_lr", min_lr, 0, false, kInf, false);
  start();
}

double CosineLR::lr_at(std::int64_t step) const {
  check_step("optim.CosineLR", step);
  if (step >= total_) return min_lr_;
  const double t = static_cast<double>(step) / static_cast<double>(total_);
  return min_lr_ + (base_lr_ - min_lr_) * (1 + std::cos(std::numbers::pi * t)) / 2;
}

OneCycleLR::OneCycleLR(Optimizer& opt, double max_lr, std::int64_t total_steps, double pct_start, double div_factor,
                       double final_div_factor)
    : LrScheduler(opt),
      max_lr_(max_lr),
      total_(total_steps),
      pct_start_(pct_start),
      div_factor_(div_factor),
      final_div_factor_(final_div_factor) {
  const char* who = "optim.OneCycleLR";
  detail::check_range(who, "max_lr", max_lr, 0, false, kInf, false);
  check_positive_steps(who, "total_steps", total_steps);
  detail::check_range(who, "pct_start", pct_start, 0, false, 1, false);
  detail::check_range(who, "div_factor", div_factor, 0, true, kInf, false);
  detail::check_range(who, "final_div_factor", final_div_factor, 0, true, kInf, false);
  start();
}

double OneCycleLR::lr_at(std::int64_t step) const {
  check_step("optim.OneCycleLR", step);
  const double initial_lr = max_lr_ / div_factor_;
  const double min_lr = initial_lr / final_div_factor_;
  // Phase ends as PyTorch computes them: float(pct_start * total) - 1, then total - 1.
  const double end_up = pct_start_ * static_cast<double>(total_) - 1;
  const double end_down = static_cast<double>(total_ - 1);
  const double s = static_cast<double>(std::min(step, total_ - 1));  // held at the last value after the end
  // A phase of no length has already reached its end value.
  auto pct = [](double done, double length) { return length > 0 ? done / length : 1.0; };
  if (s <= end_up) return anneal_cos(initial_lr, max_lr_, pct(s, end_up));
  return anneal_cos(max_lr_, min_lr, pct(s - end_up, end_down - end_up));
}

}  // namespace kiln::optim
