#pragma once
// The kernels a training run will ask for, listed before it starts (kiln/kernel_plan.h), so a
// cold process compiles them all at once while it loads the data.
#include <kiln/kernel_plan.h>

#include "speedrun.h"
#include "train.h"

namespace mnist {

// MNIST's split: the plan's batches have the sizes the real files give.
constexpr std::int64_t kTrainImages = 60'000, kTestImages = 10'000;

// A shape-only pass of `o`'s run on a model, optimizer and data of its own: the loader's
// batches (a full one and the epoch's short last one), the training step for each, the
// evaluation step and the sums around them. Sets the TF32 switches as train() does.
kiln::KernelPlan plan_training(const TrainOptions& o);

// The same for --recipe speedrun: one seed's run (warm-up, a step, the evaluations) on a blank
// training batch and test batch, whose steps have the real run's shapes.
kiln::KernelPlan plan_speedrun(const SpeedrunRecipe& recipe, kiln::Device device, bool compiled);

}  // namespace mnist
