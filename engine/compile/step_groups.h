#pragma once
// Internal to engine/compile: a kernel plan's pass records each compiled step's groups (the
// fusion decisions the debug log tells) so `jitcc show --plan` can print them.
#include <string>
#include <vector>

#include "kiln/kernel_plan.h"

namespace kiln::compile_detail {

// Installed by plan_kernels for its pass: collects the steps recorded inside it.
class PlanSteps {
 public:
  PlanSteps();
  ~PlanSteps();
  PlanSteps(const PlanSteps&) = delete;
  PlanSteps& operator=(const PlanSteps&) = delete;
  std::vector<KernelPlan::Step> take();

 private:
  std::vector<KernelPlan::Step> steps_;
  std::vector<KernelPlan::Step>* outer_;
};

// Inside a PlanSteps, while alive: this thread's groups make a new step of that signature (once
// per signature).
class RecordStep {
 public:
  explicit RecordStep(const std::string& signature);
  ~RecordStep();
  RecordStep(const RecordStep&) = delete;
  RecordStep& operator=(const RecordStep&) = delete;

 private:
  KernelPlan::Step* outer_;
};

// True while a step is being recorded on this thread.
bool recording_groups();
// Appends g to the step being recorded, if any.
void record_group(KernelPlan::Group g);

}  // namespace kiln::compile_detail
