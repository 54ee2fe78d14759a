#pragma once
// One training run: the loop over epochs, evaluation on the test set, per-epoch metrics.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <kiln/kiln.h>

#include "distributed.h"
#include "steps.h"

namespace mnist {

// Bounds of the numeric flags, far past any useful run, so step counts stay small.
constexpr int kMaxEpochs = 10'000;
constexpr std::int64_t kMaxBatchSize = std::int64_t{1} << 20;

struct TrainOptions {
  std::string model = "mlp";
  std::optional<int> epochs;  // unset: the model's default
  std::int64_t batch_size = 128;
  std::optional<double> lr;  // unset: the model's and optimizer's default
  std::string optimizer = "adam";
  std::string schedule;     // empty: the model's default (cosine for mlp, onecycle for cnn)
  kiln::Device device;
  std::uint64_t seed = 0;
  std::string save, load, metrics;
  std::string plot;  // an SVG of the training curves, rewritten after each epoch
  std::string checkpoint;  // written after every epoch: what --resume needs (resume.h)
  std::string resume;  // a --checkpoint file to continue from; "auto": o.checkpoint when it exists
  bool eval_only = false;
  bool eager = false;  // on a GPU, run the steps op by op instead of as CUDA graphs
  std::string precision = "default";  // default, f32, tf32, bf16 or f16 (apply_precision)
  bool sync_bn = false;  // under a launcher, the cnn's batch norms become dist::SyncBatchNorm
};

// Seconds since the program was loaded (whole-process times in the summary).
double seconds_since_start();

// Whether the steps run compiled: on a CUDA device unless o.eager.
bool compiled_steps(const TrainOptions& o);

// --precision: default is the library's (and PyTorch's) policy, convs on TF32 tensor cores and
// matmuls exact; f32 computes exactly in f32 (TF32 off for matmuls and convs), tf32 lets both
// use TF32 tensor cores, bf16 and f16 run forward and loss under an autocast scope of that
// dtype (f32 master weights; TF32 off), f16 with a GradScaler. On the CPU the TF32 switches
// change nothing. Sets the TF32 switches and returns the autocast dtype (nullopt for default,
// f32 and tf32).
std::optional<kiln::DType> apply_precision(const std::string& precision);

// The model's defaults filled in; ValueError for an unknown model, optimizer, schedule or precision,
// epochs or batch size outside [1, kMax...], an lr that is not finite and > 0, --resume auto
// without --checkpoint, or --sync-bn for the mlp.
TrainOptions with_defaults(TrainOptions o);

// Up front, before any training: ValueError naming the flag and file unless --save, --plot and
// --checkpoint name a new or regular file and --metrics a writable path, each in an existing
// writable directory, and --resume (other than auto) an existing file.
void check_output_files(const TrainOptions& o);

// The pieces train() builds from `o`; the kernel plan (plan.h) builds the same ones.
kiln::data::LoaderOptions loader_options(std::int64_t batch, bool shuffle, std::uint64_t seed, kiln::Device device);
std::unique_ptr<kiln::optim::Optimizer> make_optimizer(const TrainOptions& o, std::vector<kiln::Tensor> params);
std::unique_ptr<kiln::optim::LrScheduler> make_schedule(const TrainOptions& o, kiln::optim::Optimizer& opt,
                                                        std::int64_t steps);

struct EpochMetrics {
  int epoch = 0;
  double train_loss = 0, test_loss = 0, test_accuracy = 0;  // accuracy in [0, 1]
  double seconds = 0;                                       // training time of this epoch (evaluation excluded)
  double samples_per_s = 0;
};

struct Evaluation {
  double loss = 0, accuracy = 0;
};

struct RunResult {
  std::vector<EpochMetrics> epochs;
  double best_accuracy = 0;
  std::optional<double> seconds_to_98, seconds_to_99;  // cumulative training seconds
  std::optional<double> process_seconds_to_99;         // since the process started, at the end of that epoch
  double train_seconds = 0, samples_per_s = 0;
  std::optional<kiln::CompileStats> train_step, eval_step;  // set when the steps ran compiled
  double first_steps_wait_ms = 0;  // how long the first two training steps waited for kernels
};

// Mean cross-entropy and accuracy of `model` on the test set (eval mode, no grad). One
// evaluator serves every epoch, so a compiled pass is captured once per run.
class Evaluator {
 public:
  Evaluator(kiln::nn::Module& model, const kiln::data::Mnist& data, kiln::Device device, bool compiled,
            std::optional<kiln::DType> autocast = std::nullopt);
  Evaluation operator()();
  std::optional<kiln::CompileStats> stats() const { return step_.stats(); }

 private:
  kiln::nn::Module& model_;
  kiln::data::DataLoader test_;
  kiln::Device device_;
  Step step_;
};

// Trains from `o` (defaults already applied), printing progress to stdout, with o.metrics one
// JSON object per epoch to that file, with o.plot the curves so far after each epoch; IoError
// naming the file when a write fails. With o.checkpoint a checkpoint after every epoch; with
// o.resume the run continues after the epochs the checkpoint holds (resume.h).
// With `dist` launched (data-parallel), o.batch_size is per GPU: each rank trains its rows of
// global batches of o.batch_size * world, and only rank 0 prints, evaluates and writes files.
RunResult train(const TrainOptions& o, const kiln::data::Mnist& data, Distributed* dist = nullptr);

}  // namespace mnist
