#include "train.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "models.h"
#include "plot_svg.h"
#include "progress.h"
#include "resume.h"

namespace mnist {

using namespace kiln;

namespace {

// Set while the program loads, before main: the start of a whole-process time.
const auto g_process_start = std::chrono::steady_clock::now();

// Steps timed (after the first) for the estimate of a long CPU run.
constexpr std::int64_t kEstimateAfterSteps = 4;

// MNIST's pixel mean and standard deviation over the training set.

std::string metrics_json(const EpochMetrics& m, const std::string& precision) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "{\"epoch\":%d,\"train_loss\":%.6f,\"test_loss\":%.6f,\"test_accuracy\":%.6f,\"seconds\":%.4f,"
                "\"samples_per_s\":%.1f,\"precision\":\"%s\"}",
                m.epoch, m.train_loss, m.test_loss, m.test_accuracy, m.seconds, m.samples_per_s, precision.c_str());
  return buf;
}

// The --metrics file, one JSON line per epoch. Each line is flushed and the stream checked,
// so a full disk (or /dev/full) is an error naming the file rather than metrics lost silently.
class MetricsFile {
 public:
  explicit MetricsFile(const std::string& path) : path_(path) {
    if (path_.empty()) return;
    out_.open(path_, std::ios::trunc);
    if (!out_) fail("a writable file");
  }
  void write(const std::string& line) {
    if (path_.empty()) return;
    out_ << line << '\n' << std::flush;
    if (!out_) fail("room for one more line of metrics");
    written_ += line.size() + 1;
  }
  void close() {
    if (path_.empty()) return;
    out_.close();
    if (!out_) fail("a successful close");
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw IoError(path_, written_, "expected " + what + " for --metrics (" + std::strerror(errno) + ")");
  }
  std::string path_;
  std::ofstream out_;
  std::uint64_t written_ = 0;
};

// The --plot chart: losses above, test accuracy below, one point per epoch as in --metrics;
// the title holds the settings that tell two runs' charts apart.
Chart training_chart(const TrainOptions& o, const std::vector<EpochMetrics>& epochs) {
  PlotSeries train_loss{"train-loss", "train loss", "#1f77b4", {}}, test_loss{"test-loss", "test loss", "#ff7f0e", {}},
      test_accuracy{"test-accuracy", "test accuracy", "#2ca02c", {}};
  for (const EpochMetrics& m : epochs) {
    train_loss.points.emplace_back(m.epoch, m.train_loss);
    test_loss.points.emplace_back(m.epoch, m.test_loss);
    test_accuracy.points.emplace_back(m.epoch, m.test_accuracy);
  }
  char settings[256];
  std::snprintf(settings, sizeof settings, "%s lr %g (%s), batch %lld, precision %s, seed %llu", o.optimizer.c_str(),
                o.lr.value_or(0), o.schedule.c_str(), static_cast<long long>(o.batch_size), o.precision.c_str(),
                static_cast<unsigned long long>(o.seed));
  const std::string run = "mnist-train: " + o.model + " on " + o.device.str() + " (" +
                          (compiled_steps(o) ? "compiled" : "eager") + " steps), " +
                          std::to_string(o.epochs.value_or(0)) + " epochs";
  return {.title = {run, settings},
          .x_label = "epoch",
          .panels = {{.y_label = "cross-entropy loss", .series = {train_loss, test_loss}, .from_zero = true},
                     {.y_label = "test accuracy (%)", .series = {test_accuracy}, .y_scale = 100}}};
}

// An epoch's metrics (train_seconds already counting it) in the run's summary.
void note_epoch(RunResult& r, const EpochMetrics& m) {
  if (m.test_accuracy >= 0.98 && !r.seconds_to_98) r.seconds_to_98 = r.train_seconds;
  if (m.test_accuracy >= 0.99 && !r.seconds_to_99) {
    r.seconds_to_99 = r.train_seconds;
    r.process_seconds_to_99 = seconds_since_start();
  }
  r.best_accuracy = std::max(r.best_accuracy, m.test_accuracy);
  r.epochs.push_back(m);
}

}  // namespace

data::LoaderOptions loader_options(std::int64_t batch, bool shuffle, std::uint64_t seed, Device device) {
  return {.batch_size = batch, .shuffle = shuffle, .seed = seed, .device = device, .mean = kMean, .std = kStd};
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainOptions& o, std::vector<Tensor> params) {
  const double lr = o.lr.value();
  if (o.optimizer == "sgd")
    return std::make_unique<optim::SGD>(std::move(params),
                                        optim::SgdOptions{.lr = lr, .momentum = 0.9, .nesterov = true});
  if (o.optimizer == "adamw")
    return std::make_unique<optim::AdamW>(std::move(params), optim::AdamOptions{.lr = lr, .weight_decay = 0.01});
  return std::make_unique<optim::Adam>(std::move(params), optim::AdamOptions{.lr = lr});
}

std::unique_ptr<optim::LrScheduler> make_schedule(const TrainOptions& o, optim::Optimizer& opt, std::int64_t steps) {
  const double lr = o.lr.value();
  if (o.schedule == "cosine") return std::make_unique<optim::CosineLR>(opt, lr, steps);
  if (o.schedule == "onecycle") return std::make_unique<optim::OneCycleLR>(opt, lr, steps);
  if (o.schedule == "step") return std::make_unique<optim::StepLR>(opt, lr, std::max<std::int64_t>(1, steps / 3), 0.1);
  return nullptr;  // "none"
}

double seconds_since_start() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - g_process_start).count();
}

std::optional<DType> apply_precision(const std::string& precision) {
  // Set both ways every time: the switches are process-wide and a run must not inherit them.
  set_allow_tf32(precision == "tf32");
  set_allow_conv_tf32(precision == "tf32" || precision == "default");
  if (precision == "bf16") return DType::bf16;
  if (precision == "f16") return DType::f16;
  return std::nullopt;
}

TrainOptions with_defaults(TrainOptions o) {
  const bool cnn = o.model == "cnn";
  if (o.model != "mlp" && !cnn) throw ValueError("[mnist-train] --model must be mlp or cnn, got '" + o.model + "'");
  if (o.optimizer != "sgd" && o.optimizer != "adam" && o.optimizer != "adamw")
    throw ValueError("[mnist-train] --optimizer must be sgd, adam or adamw, got '" + o.optimizer + "'");
  if (o.schedule.empty()) o.schedule = cnn ? "onecycle" : "cosine";
  if (o.schedule != "none" && o.schedule != "step" && o.schedule != "cosine" && o.schedule != "onecycle")
    throw ValueError("[mnist-train] --schedule must be none, step, cosine or onecycle, got '" + o.schedule + "'");
  if (o.precision != "default" && o.precision != "f32" && o.precision != "tf32" && o.precision != "bf16" &&
      o.precision != "f16")
    throw ValueError("[mnist-train] --precision must be default, f32, tf32, bf16 or f16, got '" + o.precision + "'");
  if (o.sync_bn && !cnn) throw ValueError("[mnist-train] --sync-bn: the " + o.model + " has no batch norm");
  if (!o.epochs) o.epochs = cnn ? 5 : 10;
  if (*o.epochs < 1 || *o.epochs > kMaxEpochs)
    throw ValueError("[mnist-train] --epochs must be in [1, " + std::to_string(kMaxEpochs) + "], got " +
                     std::to_string(*o.epochs));
  if (o.batch_size < 1 || o.batch_size > kMaxBatchSize)
    throw ValueError("[mnist-train] --batch-size must be in [1, " + std::to_string(kMaxBatchSize) + "], got " +
                     std::to_string(o.batch_size));
  if (!o.lr) o.lr = o.optimizer == "sgd" ? (cnn ? 0.05 : 0.1) : (cnn ? 2e-3 : 1e-3);
  if (!std::isfinite(*o.lr) || *o.lr <= 0)
    throw ValueError("[mnist-train] --lr must be finite and > 0, got " + std::to_string(*o.lr));
  if (o.resume == "auto" && o.checkpoint.empty())
    throw ValueError("[mnist-train] --resume auto needs --checkpoint FILE: it resumes from that file when it exists");
  return o;
}

void check_output_files(const TrainOptions& o) {
  auto check = [](const char* flag, const std::string& path, void (*f)(const std::string&)) {
    if (path.empty()) return;
    try {
      f(path);
    } catch (const IoError& e) {
      throw ValueError(std::string("[mnist-train] ") + flag + " " + path + ": " + e.what());
    }
  };
  check("--save", o.save, io::check_replaceable_file);
  check("--metrics", o.metrics, io::check_output_path);
  check("--plot", o.plot, io::check_replaceable_file);  // written as --save is: a new file renamed over it
  check("--checkpoint", o.checkpoint, io::check_replaceable_file);
  if (!o.resume.empty() && o.resume != "auto" && !std::filesystem::is_regular_file(o.resume))
    throw ValueError("[mnist-train] --resume " + o.resume + ": expected a checkpoint file, found " +
                     (std::filesystem::exists(o.resume) ? "something else" : "no such file"));
}

bool compiled_steps(const TrainOptions& o) { return o.device.is_cuda() && !o.eager; }

Evaluator::Evaluator(nn::Module& model, const data::Mnist& data, Device device, bool compiled,
                     std::optional<DType> autocast)
    : model_(model), test_(data.test_images, data.test_labels, loader_options(1000, false, 0, device)),
      device_(device), step_(eval_step(model, compiled, autocast)) {}

Evaluation Evaluator::operator()() {
  const bool was_training = model_.is_training();
  model_.eval();
  Tensor loss_sum = zeros({}, {.device = device_});
  Tensor correct = zeros({}, {.dtype = DType::i64, .device = device_});
  for (std::int64_t i = 0; i < test_.batches(); ++i) {
    data::Batch b = test_.batch(i);
    const std::vector<Tensor> out = step_({b.inputs, b.labels});
    loss_sum.add_(out[0]);
    correct.add_(out[1]);
  }
  model_.train(was_training);
  const double n = static_cast<double>(test_.size());
  return {loss_sum.item<double>() / n, static_cast<double>(correct.item<std::int64_t>()) / n};
}

RunResult train(const TrainOptions& o, const data::Mnist& data, Distributed* dist) {
  dist::ProcessGroup* group = dist && dist->launched() ? &*dist->group : nullptr;
  const int world = group ? dist->world : 1, rank = group ? dist->rank : 0;
  Generator gen(o.seed);
  auto model = make_model(o.model, gen);
  model->to(o.device);
  if (o.sync_bn && group) dist::convert_sync_batchnorm(*model, *group);  // keeps the tensors
  auto opt = make_optimizer(o, model->parameters());
  if (!o.load.empty()) io::load_checkpoint(o.load, *model, opt.get());
  const std::int64_t global_batch = o.batch_size * world;
  data::DataLoader loader(data.train_images, data.train_labels, loader_options(global_batch, true, o.seed, o.device));
  const int epochs = o.epochs.value();
  auto schedule = make_schedule(o, *opt, loader.batches() * epochs);
  const std::optional<DType> autocast = apply_precision(o.precision);
  optim::GradScaler scaler({.enabled = autocast == DType::f16});
  RunParts parts{*model, *opt, schedule.get(), scaler, gen, loader};
  RunSoFar so_far;  // restored before the step is built: a compiled step's first call sees the restored state
  if (const std::string from = resume_path(o); !from.empty()) {
    so_far = resume_from(from, o, world, parts);
    if (rank == 0) std::printf("resuming from %s after epoch %d of %d\n", from.c_str(), so_far.epoch, epochs);
  }
  std::optional<dist::GradReducer> reducer;
  if (group) {
    check_same_epoch(*group, so_far.epoch);
    broadcast_state(*group, *model);
    reducer.emplace(*group, model->parameters());
  }
  Step step = train_step(*model, *opt, schedule.get(), compiled_steps(o), autocast, &scaler,
                         reducer ? &*reducer : nullptr);
  std::optional<Evaluator> evaluate;
  if (rank == 0) evaluate.emplace(*model, data, o.device, compiled_steps(o), autocast);

  MetricsFile metrics(rank == 0 ? o.metrics : std::string());
  RunResult r;
  for (const EpochMetrics& m : so_far.metrics) {  // the epochs before a resume, so outputs cover the whole run
    r.train_seconds += m.seconds;
    note_epoch(r, m);
    metrics.write(metrics_json(m, o.precision));
  }
  model->train();
  for (int epoch = so_far.epoch + 1; epoch <= epochs; ++epoch) {
    loader.set_epoch(epoch - 1);
    std::optional<Progress> bar;
    if (rank == 0) bar.emplace(epoch, epochs, loader.batches(), loader.size());
    Tensor loss_sum = zeros({}, {.device = o.device});
    const auto t0 = std::chrono::steady_clock::now();
    std::chrono::steady_clock::time_point after_first_step;
    for (std::int64_t i = 0; i < loader.batches(); ++i) {
      data::Batch b = loader.batch(i);
      if (group) {  // this rank's rows of the global batch
        const auto rows = rows_of(b.inputs.size(0), rank, world);
        b.inputs = narrow(b.inputs, 0, rows.first, rows.second - rows.first);
        b.labels = narrow(b.labels, 0, rows.first, rows.second - rows.first);
      }
      // The first two calls: a compiled step's eager call and its capture.
      const bool first = epoch == so_far.epoch + 1 && i < 2;
      const double waited = kernel_stats().wait_ms;
      const Tensor loss = step({b.inputs, b.labels})[0];  // a compiled step's next call overwrites it
      if (first) r.first_steps_wait_ms += kernel_stats().wait_ms - waited;
      // Its all-reduces run inside the replayed graph: the watchdog waits on the whole step.
      if (group) group->watch("training step " + std::to_string(i + 1) + " of epoch " + std::to_string(epoch));
      loss_sum.add_(loss);
      // A CPU run (steps are synchronous there) tells, after a few steps, how long it will take
      // when that is long; the first step, which allocates, is not timed.
      if (bar && epoch == 1 && o.device.is_cpu() && i == 0) after_first_step = std::chrono::steady_clock::now();
      if (bar && epoch == 1 && o.device.is_cpu() && i == kEstimateAfterSteps) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - after_first_step).count();
        const std::int64_t done = (i + 1) * global_batch;
        const std::string note =
            long_run_note(static_cast<double>(i * global_batch) / s, loader.size() * epochs - done);
        if (!note.empty()) bar->note(note);
      }
      if (bar && bar->wants_loss(i + 1))
        bar->update(i + 1, std::min((i + 1) * global_batch, loader.size()), loss.item<double>());
    }
    if (group) group->all_reduce(loss_sum, dist::ReduceOp::avg);  // the mean over the ranks' slices
    EpochMetrics m;
    m.epoch = epoch;
    m.train_loss = loss_sum.item<double>() / static_cast<double>(loader.batches());  // waits for the epoch
    m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    m.samples_per_s = static_cast<double>(loader.size()) / m.seconds;
    r.train_seconds += m.seconds;
    if (rank != 0) continue;  // evaluation, output and files are rank 0's
    const Evaluation e = (*evaluate)();
    m.test_loss = e.loss;
    m.test_accuracy = e.accuracy;
    note_epoch(r, m);
    // Before the metrics line: a run killed once that line is there has its checkpoint.
    if (!o.checkpoint.empty())
      write_checkpoint(o.checkpoint, o, world, parts, {epoch, epoch * loader.batches(), r.epochs});
    char line[160];
    std::snprintf(line, sizeof line, "train loss %.4f  test loss %.4f  test accuracy %.2f%%  %.2fs  %.0f samples/s",
                  m.train_loss, m.test_loss, 100 * m.test_accuracy, m.seconds, m.samples_per_s);
    bar->finish(line);
    metrics.write(metrics_json(m, o.precision));
    // After each epoch, so a stopped run still has its picture; a few kB, far below an epoch's time.
    if (!o.plot.empty()) io::write_file_atomically(o.plot, render_svg(training_chart(o, r.epochs)));
  }
  metrics.close();
  r.samples_per_s = static_cast<double>(loader.size()) * epochs / r.train_seconds;
  r.train_step = step.stats();
  if (evaluate) r.eval_step = evaluate->stats();
  if (!o.save.empty() && rank == 0) io::save_checkpoint(o.save, *model, opt.get());
  return r;
}

}  // namespace mnist
