// bench_dist: data-parallel training throughput (issue 23); tools/bench/bench_dist_torch.py
// measures the same with PyTorch DDP, and tools/bench/bench_dist.sh runs both on a machine with
// two GPUs and prints them side by side:
//   kiln-run -n {1,2} -- bench_dist [--model mlp4096|cnn|all] [--precision f32,tf32,bf16]
//                                   [--steps N] [--json FILE]
// Models: mlp4096 (784-4096-4096-10) and the trainer's cnn, at --batch (1024) per GPU, Adam
// (lr 1e-3), random images and labels made on the device once. For each (model, precision): a
// compiled step (kiln::compile) whose dist::GradReducer averages the gradients during the
// backward in pieces (--piece-mb) and updates each piece's parameters as its all-reduce completes
// (--step-after-all: after the last); warm-up (the eager call, the capture, --warmup replays),
// then --repeats windows of --steps replays, each between device synchronisations. samples/s =
// world x batch x steps / seconds (the slowest rank's); the median window is reported.
// Started without a launcher it trains on cuda:0 with no process group and no reducer ("1 GPU,
// no DDP"); under kiln-run -n 1 the code path of -n 2 runs through NCCL in a world of 1: that
// run is the denominator of the scaling. Precisions as mnist-train --precision: f32 (TF32 off
// for matmuls and convs), tf32 (on), bf16 (forward and loss under autocast, f32 master weights).
// Rank 0 prints one line per row and appends one JSON line per row to --json. Exits 77 without a
// GPU, 2 on bad arguments. --device cpu runs the same rows eagerly on the CPU (tests, no launcher).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kiln/dist.h"
#include "kiln/dist/grad_reducer.h"
#include "kiln/kiln.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/generated_kernels.h"
#include "kiln/runtime/quick_tier.h"

using namespace kiln;

namespace {

struct Settings {
  std::vector<std::string> models, precisions;
  std::int64_t batch = 1024;
  int steps = 100, repeats = 3, warmup = 10;
  std::uint64_t seed = 0;
  double bucket_mb = 25, first_bucket_mb = 1, piece_mb = 0;
  bool grad_bf16 = false, bf16_grads_row = false, no_grad_view = false, no_reducer = false, step_after_all = false;
  std::string json_path, device = "cuda";
};

// The trainer's cnn (examples/mnist/models.cpp), and the wide MLP of issue 23.
std::shared_ptr<nn::Sequential> make_model(const std::string& name, Generator& gen) {
  auto net = std::make_shared<nn::Sequential>();
  if (name == "mlp4096") {
    net->push_back(nn::Flatten());
    net->push_back(nn::Linear(784, 4096, true, &gen));
    net->push_back(nn::ReLU());
    net->push_back(nn::Linear(4096, 4096, true, &gen));
    net->push_back(nn::ReLU());
    net->push_back(nn::Linear(4096, 10, true, &gen));
  } else {
    const Conv2dOptions same5{.padding = {2}};
    net->push_back(nn::Conv2d(1, 32, {5}, same5, false, &gen));
    net->push_back(nn::BatchNorm2d(32));
    net->push_back(nn::ReLU());
    net->push_back(nn::MaxPool2d({2}));  // (B, 32, 14, 14)
    net->push_back(nn::Conv2d(32, 64, {5}, same5, false, &gen));
    net->push_back(nn::BatchNorm2d(64));
    net->push_back(nn::ReLU());
    net->push_back(nn::MaxPool2d({2}));  // (B, 64, 7, 7)
    net->push_back(nn::Flatten());
    net->push_back(nn::Linear(64 * 7 * 7, 128, true, &gen));
    net->push_back(nn::ReLU());
    net->push_back(nn::Linear(128, 10, true, &gen));
  }
  return net;
}

// As mnist-train's apply_precision: the autocast dtype of the forward, if any.
std::optional<DType> apply_precision(const std::string& precision) {
  set_allow_tf32(precision == "tf32");
  set_allow_conv_tf32(precision == "tf32");
  if (precision == "bf16") return DType::bf16;
  return std::nullopt;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One all-reduce of `value` with `op` (outside the timed windows); the value itself alone.
double reduce_value(dist::ProcessGroup* group, Device dev, double value, dist::ReduceOp op) {
  if (!group) return value;
  Tensor t = full({1}, value, {.dtype = DType::f64, .device = dev});
  group->all_reduce(t, op);
  return t.item<double>();
}

// FNV-1a over every parameter's bytes, in hex: two runs trained the same weights bit for bit
// when their digests match (--step-after-all against the per-bucket steps).
std::string weights_digest(const nn::Module& net) {
  std::uint64_t h = rt::kFnvOffset;
  for (const Tensor& p : net.parameters()) {
    const Tensor host = p.detach().to(Device::cpu()).contiguous();
    h = rt::fnv1a64({static_cast<const char*>(host.data_ptr()), host.numel() * host.element_size()}, h);
  }
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

// Whether every rank holds the same weights (the sum of all parameters, compared exactly).
bool weights_agree(dist::ProcessGroup* group, Device dev, const nn::Module& net) {
  if (!group) return true;
  NoGradGuard no_grad;
  Tensor total = zeros({1}, {.dtype = DType::f64, .device = dev});
  for (const Tensor& p : net.parameters()) total.add_(sum(p.to(DType::f64)));
  Tensor all = zeros({group->world_size()}, {.dtype = DType::f64, .device = dev});
  group->all_gather(total, all);
  const std::vector<double> v = all.to_vector<double>();
  return std::all_of(v.begin(), v.end(), [&](double x) { return x == v.front(); });
}

nlohmann::json bench_row(const Settings& s, const std::string& model, const std::string& precision,
                         dist::ProcessGroup* group, Device dev) {
  const int world = group ? group->world_size() : 1, rank = group ? group->rank() : 0;
  const std::optional<DType> autocast = apply_precision(precision);
  Generator gen(s.seed);  // the same weights on every rank; broadcast below as DDP does
  auto net = make_model(model, gen);
  net->to(dev);
  if (group) {
    NoGradGuard no_grad;
    for (const auto& named : net->state()) {
      Tensor t = named.second.detach();
      group->broadcast(t, 0);
    }
  }
  Generator data_gen(s.seed + 1 + static_cast<std::uint64_t>(rank));  // each rank its own batch
  const Tensor x = randn({s.batch, 1, 28, 28}, {.dtype = DType::f32, .device = dev}, &data_gen);
  const Tensor y = randint(0, 10, {s.batch}, {.dtype = DType::i64, .device = dev}, &data_gen);
  optim::Adam opt(net->parameters(), {.lr = 1e-3});
  std::optional<dist::GradReducer> reducer;
  if (group && !s.no_reducer) {
    dist::ReducerOptions ro;
    ro.bucket_bytes = static_cast<std::size_t>(s.bucket_mb * (1 << 20));
    ro.first_bucket_bytes = static_cast<std::size_t>(s.first_bucket_mb * (1 << 20));
    ro.piece_bytes = static_cast<std::size_t>(s.piece_mb * (1 << 20));
    ro.grad_as_bucket_view = !s.no_grad_view;
    if (s.grad_bf16) ro.wire_dtype = DType::bf16;
    reducer.emplace(*group, net->parameters(), ro);
  }
  StepFunction fn = [&](const std::vector<Tensor>& in) {
    opt.zero_grad();
    Tensor loss;
    {
      AutocastGuard amp(autocast);
      loss = cross_entropy((*net)(in[0]), in[1]);
    }
    loss.backward();
    if (!reducer) {
      opt.step();
    } else if (s.step_after_all) {
      reducer->finish();
      opt.step();
    } else {
      reducer->finish(opt);  // each bucket's parameters updated as soon as its all-reduce completes
    }
    return std::vector<Tensor>{loss.detach()};
  };
  CompiledFunction step = compile(fn);
  auto run = [&](int n) {
    for (int i = 0; i < n; ++i) {
      (void)step({x, y});
      if (group) group->watch("bench_dist step");
    }
  };
  run(2 + s.warmup);  // the eager call, the capture, then replays

  std::vector<double> rates;
  for (int r = 0; r < s.repeats; ++r) {
    (void)reduce_value(group, dev, 0, dist::ReduceOp::sum);  // every rank here before the clock starts
    synchronize(dev);
    const auto t0 = std::chrono::steady_clock::now();
    run(s.steps);
    synchronize(dev);
    const double seconds = reduce_value(group, dev, seconds_since(t0), dist::ReduceOp::max);
    rates.push_back(static_cast<double>(world) * static_cast<double>(s.batch) * s.steps / seconds);
  }
  std::vector<double> sorted = rates;
  std::sort(sorted.begin(), sorted.end());
  const double rate = sorted[sorted.size() / 2];
  const float loss = step({x, y})[0].item<float>();
  const CompileStats stats = step.stats();
  std::size_t all_reduces = 0;
  if (reducer)
    for (std::size_t n : reducer->pieces()) all_reduces += n;
  nlohmann::json row = {{"bench", "kiln"},
                        {"model", model},
                        {"precision", precision},
                        {"world", world},
                        {"ddp", group != nullptr},
                        {"mode", stats.captures > 0 ? "graph" : "eager"},
                        {"batch_per_gpu", s.batch},
                        {"steps", s.steps},
                        {"repeats", s.repeats},
                        {"samples_per_s", rate},
                        {"ms_per_step", 1e3 * static_cast<double>(world * s.batch) / rate},
                        {"windows", rates},
                        {"loss", std::isfinite(loss) ? nlohmann::json(loss) : nlohmann::json(nullptr)},
                        {"weights_agree", weights_agree(group, dev, *net)},
                        {"reducer", reducer.has_value()},  // false alone, or with --no-reducer
                        {"grad_wire", s.grad_bf16 ? "bf16" : "f32"},
                        {"grad_view", !s.no_grad_view},
                        {"buckets", reducer ? reducer->buckets().size() : 0},
                        {"all_reduces", all_reduces},
                        {"bucket_step", reducer.has_value() && !s.step_after_all},
                        {"weights_digest", weights_digest(*net)},
                        {"kernels_per_graph", stats.kernels_per_graph.empty() ? 0 : stats.kernels_per_graph.front()}};
  return row;
}

std::vector<std::string> expand_all(std::vector<std::string> v, const std::vector<std::string>& all) {
  if (v.empty() || std::find(v.begin(), v.end(), "all") != v.end()) return all;
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  kiln::rt::set_quick_tier(false);  // steady-state kernels are timed, never a first use's quick builds
  Settings s;
  CLI::App app{"bench_dist: data-parallel training samples/s of kiln (run under kiln-run -n N, or alone)"};
  app.add_option("--model", s.models, "mlp4096, cnn or all (comma-separated; default all)")
      ->delimiter(',')
      ->check(CLI::IsMember({"mlp4096", "cnn", "all"}));
  app.add_option("--precision", s.precisions, "f32, tf32, bf16 (comma-separated; default all three)")
      ->delimiter(',')
      ->check(CLI::IsMember({"f32", "tf32", "bf16"}));
  app.add_option("--steps", s.steps, "Timed steps per window")->check(CLI::Range(1, 1000000));
  app.add_option("--repeats", s.repeats, "Timed windows; the median is reported")->check(CLI::Range(1, 1000));
  app.add_option("--warmup", s.warmup, "Replays before timing")->check(CLI::Range(0, 1000000));
  app.add_option("--batch", s.batch, "Batch per GPU")->check(CLI::Range(1, 1 << 20));
  app.add_option("--seed", s.seed, "Weights and data seed");
  app.add_option("--bucket-mb", s.bucket_mb, "GradReducer bucket cap in MiB")->check(CLI::Range(0.001, 4096.0));
  app.add_option("--piece-mb", s.piece_mb, "GradReducer all-reduce pieces in MiB (0: one per bucket)")
      ->check(CLI::Range(0.0, 4096.0));
  app.add_option("--first-bucket-mb", s.first_bucket_mb, "GradReducer first bucket in MiB (0: like the others)")
      ->check(CLI::Range(0.0, 4096.0));
  app.add_flag("--grad-bf16", s.grad_bf16, "All-reduce f32 gradients in bf16 (DDP's bf16_compress_hook)");
  app.add_flag("--bf16-grads-row", s.bf16_grads_row,
               "Under a launcher, each bf16 row again with gradients all-reduced in bf16");
  app.add_flag("--no-grad-view", s.no_grad_view, "Copy averaged gradients into .grad() instead of bucket views");
  app.add_flag("--no-reducer", s.no_reducer,
               "Under a launcher, no gradient all-reduce (ranks train apart): the compute-only bound of the scaling");
  app.add_flag("--step-after-all", s.step_after_all,
               "Under a launcher, the optimizer after every bucket's all-reduce (finish() then step()) instead of "
               "each bucket's parameters as soon as its all-reduce completes (finish(opt))");
  app.add_option("--device", s.device, "cuda, or cpu to check the code path without a GPU (no launcher)")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  app.add_option("--json", s.json_path, "Append one JSON line per row to this file (rank 0)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "bench_dist: %s\n", e.what());
    return 2;
  }
  s.models = expand_all(s.models, {"mlp4096", "cnn"});
  s.precisions = expand_all(s.precisions, {"f32", "tf32", "bf16"});

  std::ofstream json_out;
  try {
    // Only rank 0 writes; a bad path fails before anything is measured.
    if (dist::env_from_environment().rank == 0 && !s.json_path.empty()) {
      json_out.open(s.json_path, std::ios::app);
      if (!json_out) {
        std::fprintf(stderr, "bench_dist: cannot write %s\n", s.json_path.c_str());
        return 2;
      }
    }
  } catch (const ValueError& e) {
    std::fprintf(stderr, "bench_dist: %s\n", e.what());
    return 2;
  }
  const bool cpu = s.device == "cpu";
  if (cpu && std::getenv("WORLD_SIZE")) {
    std::fprintf(stderr, "bench_dist: --device cpu runs without a launcher (NCCL groups are GPU only)\n");
    return 2;
  }
  std::string why;
  if (!cpu && !rt::gpu_available(&why)) {
    std::printf("bench_dist: no GPU, nothing to measure (%s)\n", why.c_str());
    return 77;
  }
  try {
    std::optional<dist::ProcessGroup> group;
    if (std::getenv("WORLD_SIZE")) group.emplace(dist::ProcessGroup::init());
    const Device dev = group ? group->device() : cpu ? Device::cpu() : Device::cuda(0);
    const std::string device_name = cpu ? "cpu" : rt::device_info(dev.index()).name;
    const bool leader = !group || group->rank() == 0;
    const std::string launch = !group ? "none" : std::getenv("KILN_DIST_ID_FILE") ? "kiln-run" : "launcher";
    const std::string how = group ? "NCCL " + dist::nccl_version() + ", " + launch : cpu ? "CPU" : "1 GPU, no DDP";
    if (leader)
      std::printf("bench_dist on %s: world %d (%s), batch %lld per GPU, %d windows of %d steps%s\n",
                  device_name.c_str(), group ? group->world_size() : 1, how.c_str(), static_cast<long long>(s.batch),
                  s.repeats, s.steps, s.grad_bf16 ? ", gradients all-reduced in bf16" : "");
    for (const std::string& model : s.models)
      for (const std::string& precision : s.precisions) {
        std::vector<Settings> variants{s};
        if (s.bf16_grads_row && precision == "bf16" && group && !s.grad_bf16 && !s.no_reducer) {
          variants.push_back(s);
          variants.back().grad_bf16 = true;
        }
        for (const Settings& v : variants) {
          nlohmann::json row = bench_row(v, model, precision, group ? &*group : nullptr, dev);
          row["launch"] = launch;
          row["device"] = device_name;
          if (!leader) continue;
          std::printf(
              "%-8s %-5s %d GPU%s %-9s %12.0f samples/s %8.3f ms/step  %s, %zu buckets in %zu all-reduces%s%s, loss "
              "%s%s\n",
              model.c_str(), precision.c_str(), row["world"].get<int>(), row["world"].get<int>() > 1 ? "s" : " ",
              group ? launch.c_str() : "(no DDP)", row["samples_per_s"].get<double>(), row["ms_per_step"].get<double>(),
              row["mode"].get<std::string>().c_str(), row["buckets"].get<std::size_t>(),
              row["all_reduces"].get<std::size_t>(), v.grad_bf16 ? " (bf16 on the wire)" : "",
              row["reducer"].get<bool>() && v.step_after_all ? ", optimizer after the last" : "",
              row["loss"].dump().c_str(), row["weights_agree"].get<bool>() ? "" : "  WEIGHTS DIFFER BETWEEN RANKS");
          std::fflush(stdout);
          if (json_out.is_open()) json_out << row.dump() << "\n" << std::flush;
        }
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_dist: %s\n", e.what());
    return 1;
  }
  return 0;
}
