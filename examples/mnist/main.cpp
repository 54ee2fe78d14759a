// mnist-train: trains an MLP or a small CNN on MNIST with kiln, on the GPU when there is
// one, and reports accuracy and speed. `mnist-train --help` lists the flags.
#include <CLI/CLI.hpp>

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include <kiln/kiln.h>

#include "dataset_files.h"
#include "fatal_signals.h"
#include "models.h"
#include "plan.h"
#include "speedrun.h"
#include "train.h"
#include "version_text.h"

namespace {

using namespace kiln;

Device pick_device(const std::string& flag) {
  if (flag == "auto") return cuda_device_count() > 0 ? Device::cuda(0) : Device::cpu();
  Device d = Device::parse(flag);
  if (d.is_cuda() && d.index() >= cuda_device_count())
    throw DeviceError("[mnist-train] --device " + flag + ": this machine has " + std::to_string(cuda_device_count()) +
                      " usable GPU(s)");
  return d;
}

// CLI11's PositiveNumber lets nan and inf through and wraps "-1" into an unsigned seed; these
// check the text itself, so a value given is either used as written or refused.
const CLI::Validator kFinitePositive(
    [](std::string& s) -> std::string {
      char* end = nullptr;
      const double v = std::strtod(s.c_str(), &end);
      if (s.empty() || *end != '\0' || !std::isfinite(v) || v <= 0) return "expected a finite number > 0, got " + s;
      return {};
    },
    "FLOAT > 0");
const CLI::Validator kUnsigned64(
    [](std::string& s) -> std::string {
      std::uint64_t v = 0;
      const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (ec != std::errc{} || end != s.data() + s.size()) return "expected an integer in [0, 2^64), got " + s;
      return {};
    },
    "UINT64");
// CLI11's Range says "abc not in range"; this, checked first, says what was expected.
const CLI::Validator kInteger(
    [](std::string& s) -> std::string {
      long long v = 0;
      const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (s.empty() || ec != std::errc{} || end != s.data() + s.size()) return "expected an integer, got " + s;
      return {};
    },
    "");  // no description: --help already says INT
// The chart is SVG; a .png name would get SVG inside.
const CLI::Validator kSvgName(
    [](std::string& s) -> std::string {
      std::string tail = s.size() >= 4 ? s.substr(s.size() - 4) : s;
      for (char& c : tail) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (tail != ".svg") return "the chart is written as SVG: expected a file name ending in .svg, got " + s;
      return {};
    },
    "FILE.svg");

constexpr int kUsageExit = 2;  // as jitcc and kiln-run

int usage_error(const std::string& message) {
  std::fprintf(stderr, "mnist-train: error: %s (run 'mnist-train --help')\n", message.c_str());
  return kUsageExit;
}

// The process's kernels: compiled in it (NVRTC time summed over threads) or read from the disk cache.
void print_kernels(const std::string& more) {
  const KernelStats k = kernel_stats();
  std::printf("kernels: %llu compiled (%.0f ms of NVRTC time over all threads), %llu loaded from the disk cache%s\n",
              static_cast<unsigned long long>(k.compiled), k.compile_ms,
              static_cast<unsigned long long>(k.loaded_from_disk), more.c_str());
  if (k.quick_compiled > 0)
    std::printf("quick tier: %llu of them quick builds that ran first, %llu replaced by their full builds since\n",
                static_cast<unsigned long long>(k.quick_compiled), static_cast<unsigned long long>(k.upgraded));
  if (k.tuned > 0)  // a warm run reads the choices instead
    std::printf("tuning: %llu choices measured on the GPU in %.0f ms (KILN_TUNE)%s\n",
                static_cast<unsigned long long>(k.tuned), k.tune_ms,
                k.tuned_ahead == 0 ? ""
                                   : (", " + std::to_string(k.tuned_ahead) + " of them in " +
                                      std::to_string(std::lround(k.tune_ahead_ms)) + " ms ahead of the run")
                                         .c_str());
}

void print_summary(const mnist::RunResult& r) {
  auto when = [](const std::optional<double>& s) {
    return s ? std::to_string(*s).substr(0, std::to_string(*s).find('.') + 3) + " s" : std::string("not reached");
  };
  std::printf("best test accuracy %.2f%%\n", 100 * r.best_accuracy);
  std::printf("time to 98%%: %s, to 99%%: %s (training time, evaluation excluded)%s\n", when(r.seconds_to_98).c_str(),
              when(r.seconds_to_99).c_str(),
              r.process_seconds_to_99 ? ("; 99% at " + when(r.process_seconds_to_99) + " since the process started").c_str()
                                      : "");
  std::printf("%.2f s training, %.0f samples/s\n", r.train_seconds, r.samples_per_s);
  print_kernels("; the first two steps waited " + std::to_string(std::lround(r.first_steps_wait_ms)) + " ms for them");
  if (r.train_step) std::printf("training step graphs: %s\n", mnist::describe(*r.train_step).c_str());
  if (r.eval_step) std::printf("evaluation graphs: %s\n", mnist::describe(*r.eval_step).c_str());
}

// A cold process compiles the run's kernels on every core while it loads the data. With
// --kernel-plan FILE the plan is written first; false: --plan-only, the run stops there.
bool plan_and_prefetch(const std::function<KernelPlan()>& plan, Device device, const std::string& plan_file,
                       bool plan_only, bool leader) {
  if (plan_file.empty()) {
    try {
      prefetch_kernels(plan(), device);
    } catch (const std::exception& e) {  // only a speed-up: the run still compiles on first use
      std::fprintf(stderr, "mnist-train: warning: no kernel plan (%s); kernels compile as the run first needs them\n",
                   e.what());
    }
    return true;
  }
  const KernelPlan p = plan();
  if (leader) p.save(plan_file);
  if (plan_only) {
    if (leader) std::printf("kernel plan: %zu kernels written to %s\n", p.kernels.size(), plan_file.c_str());
    return false;
  }
  prefetch_kernels(p, device);
  return true;
}

// --recipe speedrun: `seeds` runs from `first_seed` on, a line each, then their summary; with
// a metrics path one JSON line per run.
void run_speedrun(const data::Mnist& mnist, Device device, bool compiled, std::uint64_t first_seed, int seeds,
                  const std::string& metrics_path) {
  const mnist::SpeedrunRecipe recipe;
  std::printf("recipe speedrun: conv5x5-%lld, BN, pool, conv3x3-%lld, BN, pool, FC %lld-%lld-10; %g epoch of batch "
              "%lld; Adam lr %g betas (%g, %g), one-cycle; label smoothing %g; %s\n",
              static_cast<long long>(recipe.conv1), static_cast<long long>(recipe.conv2),
              static_cast<long long>(recipe.conv2 * 25), static_cast<long long>(recipe.hidden), recipe.epochs,
              static_cast<long long>(recipe.batch_size), recipe.lr, recipe.beta1, recipe.beta2,
              recipe.label_smoothing, recipe.precision.c_str());
  std::string json;
  const mnist::SpeedrunData data(mnist, device);
  std::vector<mnist::SpeedrunRun> runs;
  for (int i = 0; i < seeds; ++i) {
    runs.push_back(mnist::speedrun(data, recipe, first_seed + static_cast<std::uint64_t>(i), device, compiled));
    std::printf("%s\n", mnist::describe(runs.back()).c_str());
    std::fflush(stdout);
    json += mnist::speedrun_json(runs.back(), recipe, device, compiled) + "\n";
    if (!metrics_path.empty()) io::write_file_atomically(metrics_path, json);  // each run kept as it ends
  }
  std::printf("%s\n", mnist::summarize(runs).c_str());
  if (!runs.back().step_graph.empty()) std::printf("training step graphs: %s\n", runs.back().step_graph.c_str());
  if (device.is_cuda()) print_kernels("");
}

}  // namespace

int main(int argc, char** argv) {
  kiln::cli::trace_fatal_signals("mnist-train");
  CLI::App app{"Train an MLP or a CNN on MNIST with kiln"};
  mnist::TrainOptions o;
  std::string data_dir, device = "auto";
  app.add_option("--data", data_dir, "directory with the four MNIST files (default: $KILN_MNIST_DIR, else ./data/mnist)");
  app.add_option("--model", o.model, "mlp (784-512-512-10) or cnn")->check(CLI::IsMember({"mlp", "cnn"}))->capture_default_str();
  app.add_option("--epochs", o.epochs, "epochs (default: 10 for mlp, 5 for cnn)")
      ->check(kInteger)
      ->check(CLI::Range(1, mnist::kMaxEpochs));
  app.add_option("--batch-size", o.batch_size, "batch size")
      ->check(kInteger)
      ->check(CLI::Range(std::int64_t{1}, mnist::kMaxBatchSize))
      ->capture_default_str();
  app.add_option("--lr", o.lr, "learning rate, the peak for onecycle (default: 1e-3 mlp, 2e-3 cnn; sgd 0.1 / 0.05)")
      ->check(kFinitePositive);
  app.add_option("--optimizer", o.optimizer, "sgd (momentum 0.9, Nesterov), adam or adamw")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}))
      ->capture_default_str();
  app.add_option("--schedule", o.schedule, "none, step, cosine or onecycle (default: cosine mlp, onecycle cnn)")
      ->check(CLI::IsMember({"none", "step", "cosine", "onecycle"}));
  app.add_option("--device", device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the initial weights and the shuffling")
      ->check(kUnsigned64)
      ->capture_default_str();
  app.add_option("--save", o.save, "write the model and optimizer state to this safetensors file at the end");
  std::string plan_file;
  bool plan_only = false;
  auto* plan_opt = app.add_option("--kernel-plan", plan_file,
                                  "write the GPU kernels this run needs (fused and per-shape ones included) to this "
                                  "file; `jitcc warm --plan FILE` compiles them ahead of time");
  app.add_flag("--plan-only", plan_only, "with --kernel-plan: write the plan and stop (no data, no training)")
      ->needs(plan_opt);
  auto* load_opt = app.add_option("--load", o.load, "start from a file written by --save");
  app.add_option("--checkpoint", o.checkpoint,
                 "after every epoch, write everything --resume needs to this safetensors file (atomically)");
  auto* resume_opt = app.add_option("--resume", o.resume,
                                    "continue a run from its --checkpoint file at the next epoch, exactly; auto: "
                                    "from the --checkpoint file when it exists, else from the start");
  app.add_option("--metrics", o.metrics, "write one JSON object per epoch to this file");
  app.add_option("--plot", o.plot,
                 "draw train and test loss and test accuracy against epochs into this SVG file (rewritten after "
                 "each epoch)")
      ->check(kSvgName);
  app.add_option("--precision", o.precision,
                 "default (the library's and PyTorch's: convs on TF32 tensor cores, matmuls exact f32), f32 "
                 "(exact: TF32 off for convs and matmuls), tf32 (TF32 tensor cores for matmuls and convs), bf16 or "
                 "f16 (autocast for forward and loss, f32 weights; f16 with dynamic loss scaling); TF32 changes "
                 "nothing on the CPU")
      ->check(CLI::IsMember({"default", "f32", "tf32", "bf16", "f16"}))
      ->capture_default_str();
  app.add_flag("--sync-bn", o.sync_bn,
               "cnn under kiln-run: batch norm statistics over the global batch of all GPUs (dist::SyncBatchNorm) "
               "instead of each GPU's own rows; without a launcher the one process holds the whole batch, so this "
               "changes nothing");
  resume_opt->excludes(load_opt)->excludes(
      app.add_flag("--eval-only", o.eval_only, "only evaluate (the model from --load) on the test set"));
  app.add_flag("--eager", o.eager,
               "on a GPU, run the training and evaluation steps op by op instead of replaying them as CUDA "
               "graphs (same results, more host work per step)");
  std::string recipe;
  int seeds = 1;
  auto* recipe_opt =
      app.add_option("--recipe", recipe,
                     "speedrun: the fastest way kiln knows to 99% test accuracy (the README says what it is); it "
                     "sets the model, epochs, batch, optimizer, schedule and precision, and prints training, "
                     "warm-up/capture and evaluation times apart")
          ->check(CLI::IsMember({"speedrun"}));
  app.add_option("--seeds", seeds, "with --recipe: runs with seeds --seed, --seed+1, ... and their summary")
      ->check(kInteger)
      ->check(CLI::Range(1, 1000))
      ->needs(recipe_opt)
      ->capture_default_str();
  for (const char* fixed : {"--model", "--epochs", "--batch-size", "--lr", "--optimizer", "--schedule", "--precision",
                            "--save", "--load", "--plot", "--eval-only", "--checkpoint", "--resume",
                            "--sync-bn"})
    recipe_opt->excludes(app.get_option(fixed));
  kiln::cli::add_version_flag(app);
  if (const std::optional<int> code = kiln::cli::parse_command_line(app, argc, argv, usage_error)) return *code;

  try {
    // Under kiln-run (or torchrun) each process trains on cuda:LOCAL_RANK; rank 0 reports.
    if (mnist::launched() && device != "auto")
      throw ValueError("[mnist-train] --device " + device +
                       ": under a launcher (kiln-run or torchrun; WORLD_SIZE is set) each rank trains on its GPU, "
                       "cuda:LOCAL_RANK; to train on " + device + ", run mnist-train without the launcher");
    mnist::Distributed dist = mnist::join_if_launched();
    if (dist.launched()) {
      if (!recipe.empty() || o.eval_only)
        throw ValueError(std::string("[mnist-train] ") + (o.eval_only ? "--eval-only" : "--recipe") +
                         " runs on one GPU: start it without a launcher");
      o.device = dist.group->device();
    } else {
      o.device = pick_device(device);
      // The context opens while the run plans, compiles and loads its data: none of them needs it.
      if (o.device.is_cuda() && !plan_only) open_device_async(o.device);
    }
    if (!plan_file.empty() && (!o.device.is_cuda() || o.eval_only))
      throw ValueError("[mnist-train] --kernel-plan lists GPU kernels: it needs a CUDA device and a training run");
    if (!recipe.empty()) {
      if (!o.metrics.empty()) mnist::check_output_files(o);
      const bool compiled = mnist::compiled_steps(o);
      if (o.device.is_cuda() &&
          !plan_and_prefetch([&] { return mnist::plan_speedrun(mnist::SpeedrunRecipe{}, o.device, compiled); },
                             o.device, plan_file, plan_only, true))
        return 0;
      const std::string dir = mnist::locate_dataset(data_dir);
      const data::Mnist mnist = data::load_mnist(dir);
      std::printf("kiln %s: recipe %s on %s (%s steps), data %s\n", kiln::version(), recipe.c_str(),
                  o.device.str().c_str(), compiled ? "compiled" : "eager", dir.c_str());
      run_speedrun(mnist, o.device, compiled, o.seed, seeds, o.metrics);
      return 0;
    }
    o = mnist::with_defaults(o);
    if (o.eval_only && o.load.empty()) throw ValueError("[mnist-train] --eval-only needs --load FILE");
    if (!o.eval_only) mnist::check_output_files(o);  // a bad path fails now, not after training
    if (o.device.is_cuda() && !o.eval_only &&
        !plan_and_prefetch([&] { return mnist::plan_training(o); }, o.device, plan_file, plan_only, dist.leader()))
      return 0;
    const std::string dir = mnist::locate_dataset(data_dir);
    const data::Mnist data = data::load_mnist(dir);
    const std::string where = dist.launched() ? std::to_string(dist.world) + (dist.world == 1 ? " GPU" : " GPUs") +
                                                    " (data-parallel over NCCL, batch " + std::to_string(o.batch_size) +
                                                    " per GPU" + (o.sync_bn ? ", SyncBatchNorm)" : ")")
                                              : o.device.str();
    if (dist.leader())
      std::printf("kiln %s: %s on %s (%s steps), precision %s, %d epochs, batch %lld, %s lr %g (%s), seed %llu, "
                  "data %s\n",
                  kiln::version(), o.model.c_str(), where.c_str(), mnist::compiled_steps(o) ? "compiled" : "eager",
                  o.precision.c_str(), *o.epochs, static_cast<long long>(o.batch_size * dist.world),
                  o.optimizer.c_str(), *o.lr, o.schedule.c_str(), static_cast<unsigned long long>(o.seed), dir.c_str());
    if (o.eval_only) {
      Generator gen(o.seed);
      auto model = mnist::make_model(o.model, gen);
      model->to(o.device);
      if (!o.load.empty()) io::load_checkpoint(o.load, *model);
      const auto autocast = mnist::apply_precision(o.precision);
      const mnist::Evaluation e = mnist::Evaluator(*model, data, o.device, mnist::compiled_steps(o), autocast)();
      std::printf("test loss %.4f, test accuracy %.2f%%\n", e.loss, 100 * e.accuracy);
      return 0;
    }
    const mnist::RunResult r = mnist::train(o, data, &dist);
    if (dist.leader()) print_summary(r);
  } catch (const mnist::MissingDataset& e) {
    std::fprintf(stderr, "mnist-train: %s", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mnist-train: %s\n", e.what());
    return 1;
  }
  return 0;
}
