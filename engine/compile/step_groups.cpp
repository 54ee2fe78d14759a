// The steps and groups a kernel plan's pass records (step_groups.h), per thread.
#include "step_groups.h"

#include <utility>

namespace kiln::compile_detail {

namespace {
thread_local std::vector<KernelPlan::Step>* t_steps = nullptr;
thread_local KernelPlan::Step* t_step = nullptr;  // in *t_steps; compiled calls do not nest
}  // namespace

PlanSteps::PlanSteps() : outer_(t_steps) { t_steps = &steps_; }
PlanSteps::~PlanSteps() { t_steps = outer_; }
std::vector<KernelPlan::Step> PlanSteps::take() { return std::move(steps_); }

RecordStep::RecordStep(const std::string& signature) : outer_(t_step) {
  t_step = nullptr;
  if (!t_steps) return;
  // A signature called again runs the same groups: listed once.
  for (const KernelPlan::Step& s : *t_steps)
    if (s.signature == signature) return;
  t_steps->push_back({signature, {}});
  t_step = &t_steps->back();
}
RecordStep::~RecordStep() { t_step = outer_; }

bool recording_groups() { return t_step != nullptr; }

void record_group(KernelPlan::Group g) {
  if (t_step) t_step->groups.push_back(std::move(g));
}

}  // namespace kiln::compile_detail
