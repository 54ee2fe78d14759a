#pragma once
// mnist-train --recipe speedrun: the fastest way kiln knows to 99% MNIST test accuracy, one
// epoch of a small batch-normed CNN in bf16 with compiled steps. The README says why each
// setting is there; tools/bench/speedrun_torch.py runs the same recipe in PyTorch.
#include <cstdint>
#include <string>
#include <vector>

#include <kiln/kiln.h>

namespace mnist {

struct SpeedrunRecipe {
  std::int64_t conv1 = 24, conv2 = 32, hidden = 256;  // conv 5x5, pool, conv 3x3, pool, FC
  std::int64_t batch_size = 256;                       // the last partial batch is dropped
  double epochs = 1.0;                                 // a fraction of an epoch takes that share of its batches
  double lr = 0.01, beta1 = 0.7, beta2 = 0.9;          // Adam, one-cycle peak lr
  double label_smoothing = 0.1;
  std::string precision = "bf16";  // as --precision
};

// The recipe's network: conv 5x5 (1 -> conv1), batch norm, ReLU, max pool 2, conv 3x3
// (conv1 -> conv2), batch norm, ReLU, max pool 2, flatten, linear (conv2*5*5 -> hidden), ReLU,
// linear (hidden -> 10). The convs have no bias: batch norm follows them.
std::shared_ptr<kiln::nn::Sequential> make_speedrun_model(const SpeedrunRecipe& r, kiln::Generator& gen);

struct SpeedrunRun {
  std::uint64_t seed = 0;
  std::int64_t steps = 0;
  double test_accuracy = 0, test_loss = 0;  // accuracy in [0, 1]
  double train_seconds = 0;    // first step to the end of the last one, the data on the device
  double capture_seconds = 0;  // warm-up: kernels loaded or compiled, steps captured
  double eval_seconds = 0;     // the final evaluation on the test set
  std::string step_graph;      // the compiled training step's graph (describe(CompileStats)), if any
};

// The MNIST training set normalised once on `device` ((N, 1, 28, 28) f32, labels i64), so a
// step only gathers its batch; built once and shared by every seed of a run.
struct SpeedrunData {
  SpeedrunData(const kiln::data::Mnist& mnist, kiln::Device device);
  const kiln::data::Mnist& mnist;
  kiln::Tensor images, labels;
};

// One run of the recipe with `seed` (weights and shuffling). Before the clock starts it warms
// up on two real batches (the eager call and the capture when `compiled`) and an evaluation,
// then puts the weights, batch-norm statistics, optimizer and schedule back to their start.
SpeedrunRun speedrun(const SpeedrunData& data, const SpeedrunRecipe& recipe, std::uint64_t seed, kiln::Device device,
                     bool compiled);

// One line per run and a summary over runs (accuracy mean/min/max, training time median).
std::string describe(const SpeedrunRun& r);
std::string summarize(const std::vector<SpeedrunRun>& runs);
std::string speedrun_json(const SpeedrunRun& r, const SpeedrunRecipe& recipe, kiln::Device device, bool compiled);

}  // namespace mnist
