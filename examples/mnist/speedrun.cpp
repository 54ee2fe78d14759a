#include "speedrun.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "models.h"
#include "train.h"

namespace mnist {

using namespace kiln;

namespace {


using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The module tensors (parameters, then buffers) copied aside, to put back in place: a captured
// step keeps pointing at the same storage.
class StateSnapshot {
 public:
  explicit StateSnapshot(const nn::Module& m) : live_(m.state()) {
    NoGradGuard no_grad;
    for (const auto& [name, t] : live_) saved_.push_back(t.detach().clone());
  }
  void restore() {
    NoGradGuard no_grad;
    for (std::size_t i = 0; i < live_.size(); ++i) {
      Tensor t = live_[i].second.detach();
      t.copy_(saved_[i]);
    }
  }

 private:
  nn::NamedTensors live_;
  std::vector<Tensor> saved_;
};

}  // namespace

std::shared_ptr<nn::Sequential> make_speedrun_model(const SpeedrunRecipe& r, Generator& gen) {
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(nn::Conv2d(1, r.conv1, {5}, {}, false, &gen));  // (B, conv1, 24, 24)
  net->push_back(nn::BatchNorm2d(r.conv1));
  net->push_back(nn::ReLU());
  net->push_back(nn::MaxPool2d({2}));  // 12 x 12
  net->push_back(nn::Conv2d(r.conv1, r.conv2, {3}, {}, false, &gen));  // 10 x 10
  net->push_back(nn::BatchNorm2d(r.conv2));
  net->push_back(nn::ReLU());
  net->push_back(nn::MaxPool2d({2}));  // 5 x 5
  net->push_back(nn::Flatten());
  net->push_back(nn::Linear(r.conv2 * 5 * 5, r.hidden, true, &gen));
  net->push_back(nn::ReLU());
  net->push_back(nn::Linear(r.hidden, 10, true, &gen));
  return net;
}

SpeedrunData::SpeedrunData(const data::Mnist& m, Device device) : mnist(m) {
  NoGradGuard no_grad;
  const Tensor x = cast(m.train_images.to(device), DType::f32);
  images = ((x * (1.0 / 255.0) - kMean) / kStd).reshape({x.size(0), 1, 28, 28});
  labels = m.train_labels.to(DType::i64).to(device);
}

SpeedrunRun speedrun(const SpeedrunData& data, const SpeedrunRecipe& recipe, std::uint64_t seed, Device device,
                     bool compiled) {
  Generator gen(seed);
  auto model = make_speedrun_model(recipe, gen);
  model->to(device);
  optim::Adam opt(model->parameters(), {.lr = recipe.lr, .beta1 = recipe.beta1, .beta2 = recipe.beta2});
  // The dataset is already on the device: a batch is its rows, gathered inside the step.
  data::DataLoader loader(data.images, data.labels,
                          {.batch_size = recipe.batch_size, .shuffle = true, .drop_last = true, .seed = seed,
                           .device = device, .scale = 1.0});
  const std::int64_t steps =
      std::max<std::int64_t>(1, std::llround(recipe.epochs * static_cast<double>(loader.batches())));
  optim::OneCycleLR schedule(opt, recipe.lr, steps);
  const std::optional<DType> autocast = apply_precision(recipe.precision);

  // Under autocast the convs read the images in its dtype: cast once here, not in every step.
  const Tensor images = autocast ? cast(data.images, *autocast) : data.images, labels = data.labels;
  auto fn = [&](const std::vector<Tensor>& in) {
    opt.zero_grad();
    Tensor loss;
    {
      AutocastGuard amp(autocast);
      const Tensor x = index_select(images, 0, in[0]), y = index_select(labels, 0, in[0]);
      loss = cross_entropy((*model)(x), y, Reduction::mean, recipe.label_smoothing);
    }
    loss.backward();
    opt.step();
    schedule.step();
    return std::vector<Tensor>{loss.detach()};
  };
  Step step(fn, compiled);
  Evaluator evaluate(*model, data.mnist, device, compiled, autocast);

  // Warm-up on real batches, then everything back to where it started.
  SpeedrunRun run;
  run.seed = seed;
  run.steps = steps;
  StateSnapshot start(*model);
  model->train();
  auto t0 = Clock::now();
  for (std::int64_t i = 0; i < std::min<std::int64_t>(2, loader.batches()); ++i) step({loader.indices(i)});
  evaluate();
  start.restore();
  opt.reset_state();
  schedule.reset();
  synchronize(device);
  run.capture_seconds = seconds_since(t0);

  t0 = Clock::now();
  for (std::int64_t i = 0; i < steps; ++i) {
    if (i % loader.batches() == 0) loader.set_epoch(i / loader.batches());  // the shuffle is part of training
    step({loader.indices(i % loader.batches())});
  }
  synchronize(device);
  run.train_seconds = seconds_since(t0);

  t0 = Clock::now();
  const Evaluation e = evaluate();
  run.eval_seconds = seconds_since(t0);
  if (const auto stats = step.stats()) run.step_graph = describe(*stats);
  run.test_accuracy = e.accuracy;
  run.test_loss = e.loss;
  return run;
}

std::string describe(const SpeedrunRun& r) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "seed %llu: test accuracy %.2f%% (loss %.4f), training %.4f s (%lld steps), warm-up and capture "
                "%.3f s, final evaluation %.4f s",
                static_cast<unsigned long long>(r.seed), 100 * r.test_accuracy, r.test_loss, r.train_seconds,
                static_cast<long long>(r.steps), r.capture_seconds, r.eval_seconds);
  return buf;
}

std::string summarize(const std::vector<SpeedrunRun>& runs) {
  if (runs.empty()) return "no runs";
  std::vector<double> acc, secs;
  for (const SpeedrunRun& r : runs) {
    acc.push_back(r.test_accuracy);
    secs.push_back(r.train_seconds);
  }
  std::sort(secs.begin(), secs.end());
  const double n = static_cast<double>(runs.size());
  const double median = secs.size() % 2 ? secs[secs.size() / 2] : (secs[secs.size() / 2 - 1] + secs[secs.size() / 2]) / 2;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%zu run(s): test accuracy mean %.3f%%, min %.2f%%, max %.2f%%; training time median %.4f s, mean "
                "%.4f s",
                runs.size(), 100 * std::accumulate(acc.begin(), acc.end(), 0.0) / n,
                100 * *std::min_element(acc.begin(), acc.end()), 100 * *std::max_element(acc.begin(), acc.end()),
                median, std::accumulate(secs.begin(), secs.end(), 0.0) / n);
  return buf;
}

std::string speedrun_json(const SpeedrunRun& r, const SpeedrunRecipe& recipe, Device device, bool compiled) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{\"recipe\":\"speedrun\",\"seed\":%llu,\"test_accuracy\":%.6f,\"test_loss\":%.6f,\"train_seconds\":%.6f,"
                "\"capture_seconds\":%.6f,\"eval_seconds\":%.6f,\"steps\":%lld,\"batch_size\":%lld,\"precision\":\"%s\","
                "\"device\":\"%s\",\"compiled\":%s}",
                static_cast<unsigned long long>(r.seed), r.test_accuracy, r.test_loss, r.train_seconds,
                r.capture_seconds, r.eval_seconds, static_cast<long long>(r.steps),
                static_cast<long long>(recipe.batch_size), recipe.precision.c_str(), device.str().c_str(),
                compiled ? "true" : "false");
  return buf;
}

}  // namespace mnist
