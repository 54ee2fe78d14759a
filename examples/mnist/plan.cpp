#include "plan.h"

#include "models.h"

namespace mnist {

using namespace kiln;

namespace {

// Zero images and labels in the layout of load_mnist: u8 (n, 28, 28), i64 (n).
std::pair<Tensor, Tensor> blank_split(std::int64_t n) {
  return {zeros({n, 28, 28}, {.dtype = DType::u8}), zeros({n}, {.dtype = DType::i64})};
}

}  // namespace

KernelPlan plan_training(const TrainOptions& o) {
  const std::optional<DType> autocast = apply_precision(o.precision);
  const bool compiled = compiled_steps(o);
  return plan_kernels(
      [&] {
        Generator gen(o.seed);
        auto model = make_model(o.model, gen);
        model->to(o.device);
        auto opt = make_optimizer(o, model->parameters());
        auto schedule = make_schedule(o, *opt, 2);
        optim::GradScaler scaler({.enabled = autocast == DType::f16});
        // One full batch and, when the epoch does not divide, its short last one.
        const std::int64_t rest = kTrainImages % o.batch_size;
        data::Mnist blank;
        std::tie(blank.train_images, blank.train_labels) = blank_split(o.batch_size + rest);
        std::tie(blank.test_images, blank.test_labels) = blank_split(std::min<std::int64_t>(1000, kTestImages));
        data::DataLoader loader(blank.train_images, blank.train_labels, loader_options(o.batch_size, true, o.seed, o.device));
        Step step = train_step(*model, *opt, schedule.get(), compiled, autocast, &scaler, nullptr);
        Evaluator evaluate(*model, blank, o.device, compiled, autocast);
        model->train();
        Tensor loss_sum = zeros({}, {.device = o.device});
        for (std::int64_t i = 0; i < loader.batches(); ++i) {
          const data::Batch b = loader.batch(i);
          loss_sum.add_(step({b.inputs, b.labels})[0]);
        }
        loss_sum.item<double>();
        evaluate();
      },
      o.device);
}

KernelPlan plan_speedrun(const SpeedrunRecipe& recipe, Device device, bool compiled) {
  return plan_kernels(
      [&] {
        // The recipe drops the epoch's short last batch; the evaluation takes the test set 1000 at a time.
        data::Mnist blank;
        std::tie(blank.train_images, blank.train_labels) = blank_split(recipe.batch_size);
        std::tie(blank.test_images, blank.test_labels) = blank_split(std::min<std::int64_t>(1000, kTestImages));
        const SpeedrunData data(blank, device);
        (void)speedrun(data, recipe, 0, device, compiled);
      },
      device);
}

}  // namespace mnist
