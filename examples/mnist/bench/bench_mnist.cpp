// The MNIST figures of the trainer issue, for kiln; tools/bench/bench_mnist_torch.py measures
// the same in PyTorch and prints both side by side:
//   step  ms per training step (zero_grad, forward, backward, Adam step) with the batch already
//         on the device: mlp at batch 128 and 1024, cnn at batch 128
//   graph the same steps compiled (kiln::compile: CUDA graph replays, inputs copied in), with
//         the ratio eager/compiled and the kernels per graph in the note
//   tta   time to accuracy: seconds of training (evaluation, every quarter epoch, excluded)
//         until the test accuracy reaches 98% (mlp) or 99% (cnn) with the trainer's defaults
// Prints a table, then one JSON line. Exits 77 without a GPU.
//   fused the compiled steps with fusion on (CompileOptions::fuse)
//   bench_mnist [--data DIR] [--steps N] [--seed S] [--only mlp|cnn] [--no-tta] [--tf32]
//               [--precision f32|tf32|bf16|f16] [--profile]
// --profile runs only the compiled steps (mlp b128 or cnn b128 as --only says), the eager call,
// the capture and --steps replays, untimed: the last replay's kernels are the graph's nodes for
// `ncu --graph-profiling node`.
// --tf32 lets f32 matmuls use TF32 tensor cores (kiln::set_allow_tf32); KILN_TUNE=off measures
// the heuristics' kernels instead of the tuned choices (on by default). --precision measures every row as
// mnist-train --precision trains: f32 with TF32 off for matmuls and convs, tf32 with both on,
// bf16/f16 with forward and loss under autocast (f16 with a GradScaler); without it, the
// library's defaults (TF32 for convs only, as PyTorch). The JSON line then names the precision.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/runtime/quick_tier.h"
#include "models.h"

using namespace kiln;

namespace {

const Device kGpu = Device::cuda(0);

struct Row {
  std::string name;
  double value;
  std::string unit;
  std::string note;
};
std::vector<Row> g_rows;
std::optional<DType> g_autocast;  // --precision bf16 / f16

// Forward and loss under the precision's autocast, then backward and the step through the
// scaler (a plain backward and step unless f16); returns the loss.
Tensor train_on(nn::Module& net, optim::Optimizer& opt, optim::GradScaler& scaler, const Tensor& x, const Tensor& y) {
  Tensor loss;
  {
    AutocastGuard amp(g_autocast);
    loss = cross_entropy(net(x), y);
  }
  scaler.scale(loss).backward();
  scaler.step(opt);
  scaler.update();
  return loss;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct StepTime {
  double ms = 0;
  CompileStats stats;  // of the compiled step; empty when eager
};

// Median ms per step over `steps` steps (after 20 warm-up steps), timed in 5 groups; with
// `compiled` the same step runs through kiln::compile (captured at the second call). `profile`
// (--profile): the step called `steps` + 2 times (eager, capture, replays), nothing timed.
StepTime step_ms(const std::string& model, std::int64_t batch, int steps, std::uint64_t seed, bool compiled,
                 bool fuse = false, bool profile = false) {
  Generator gen(seed);
  auto net = mnist::make_model(model, gen);
  net->to(kGpu);
  optim::Adam opt(net->parameters(), {.lr = 1e-3});
  optim::GradScaler scaler({.enabled = g_autocast == DType::f16});
  Tensor x = randn({batch, 1, 28, 28}, {.device = kGpu}, &gen);
  Tensor y = randint(0, 10, {batch}, {.device = kGpu}, &gen);
  StepFunction fn = [&](const std::vector<Tensor>& in) {
    opt.zero_grad();
    return std::vector<Tensor>{train_on(*net, opt, scaler, in[0], in[1]).detach()};
  };
  std::optional<CompiledFunction> cf;
  if (compiled) cf.emplace(compile(fn, {.fuse = fuse}));
  auto step = [&] { (void)(cf ? (*cf)({x, y}) : fn({x, y})); };
  if (profile) {
    for (int i = 0; i < steps + 2; ++i) step();
    synchronize(kGpu);
    return {0, cf ? cf->stats() : CompileStats{}};
  }
  for (int i = 0; i < 20; ++i) step();
  std::vector<double> ms;
  for (int g = 0; g < 5; ++g) {
    (void)sum(x).item<float>();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) step();
    (void)sum(net->parameters().front()).item<float>();
    ms.push_back(seconds_since(t0) * 1e3 / steps);
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], cf ? cf->stats() : CompileStats{}};
}

// Adds the row of a compiled step, with the ratio to eager and the graph's kernel count in its
// note, and prints which kernels the graph holds, most frequent first, and its longest chain's in
// order (names cut to 48 characters).
void add_graph_row(const std::string& row, const StepTime& graph, double eager_ms) {
  const CompileStats& s = graph.stats;
  char note[200];
  std::snprintf(note, sizeof note,
                "eager/compiled %.2fx, %zu kernels per graph (longest chain %zu, %zu launched early), %llu replays",
                eager_ms / graph.ms, s.kernels_per_graph.empty() ? std::size_t{0} : s.kernels_per_graph.front(),
                s.kernel_chain_per_graph.empty() ? std::size_t{0} : s.kernel_chain_per_graph.front(),
                s.programmatic_edges_per_graph.empty() ? std::size_t{0} : s.programmatic_edges_per_graph.front(),
                static_cast<unsigned long long>(s.replays));
  g_rows.push_back({row, graph.ms, "ms", note});
  if (s.kernel_names_per_graph.empty()) return;
  std::vector<std::pair<std::size_t, std::string>> names;
  for (const auto& [name, count] : s.kernel_names_per_graph.front()) names.emplace_back(count, name.substr(0, 48));
  std::sort(names.rbegin(), names.rend());
  std::printf("%s kernel nodes:", row.c_str());
  for (const auto& [count, name] : names) std::printf(" %s x%zu;", name.c_str(), count);
  std::printf("\n%s longest chain:", row.c_str());
  if (!s.chain_kernels_per_graph.empty())
    for (const std::string& name : s.chain_kernels_per_graph.front()) std::printf(" %s;", name.substr(0, 48).c_str());
  std::printf("\n");
}

// step_<model>_b<batch> eager, graph_<model>_b<batch> the same step compiled, and fused_<...>
// compiled with fusion on (kernels per step before and after fusion in the notes).
void add_step_rows(const std::string& model, std::int64_t batch, int steps, std::uint64_t seed) {
  const std::string tag = model + "_b" + std::to_string(batch);
  const StepTime eager = step_ms(model, batch, steps, seed, false);
  g_rows.push_back({"step_" + tag, eager.ms, "ms", ""});
  add_graph_row("graph_" + tag, step_ms(model, batch, steps, seed, true), eager.ms);
  add_graph_row("fused_" + tag, step_ms(model, batch, steps, seed, true, true), eager.ms);
}

double accuracy(nn::Module& net, const data::Mnist& d) {
  NoGradGuard no_grad;
  AutocastGuard amp(g_autocast);
  net.eval();
  data::DataLoader test(d.test_images, d.test_labels,
                        {.batch_size = 1000, .shuffle = false, .device = kGpu, .mean = mnist::kMean, .std = mnist::kStd});
  Tensor correct = zeros({}, {.dtype = DType::i64, .device = kGpu});
  for (std::int64_t i = 0; i < test.batches(); ++i) {
    data::Batch b = test.batch(i);
    correct.add_(sum(eq(argmax(net(b.inputs.reshape({b.inputs.size(0), 1, 28, 28})), 1), b.labels)));
  }
  net.train();
  return static_cast<double>(correct.item<std::int64_t>()) / static_cast<double>(test.size());
}

// The trainer's defaults: Adam, batch 128; mlp cosine lr 1e-3 over 10 epochs, cnn one-cycle
// peak 2e-3 over 5. Returns training seconds to `target`, or -1 when the run ends first.
double time_to_accuracy(const std::string& model, double target, const data::Mnist& d, std::uint64_t seed,
                        std::string& note) {
  const bool cnn = model == "cnn";
  const int epochs = cnn ? 5 : 10;
  const double lr = cnn ? 2e-3 : 1e-3;
  Generator gen(seed);
  auto net = mnist::make_model(model, gen);
  net->to(kGpu);
  optim::Adam opt(net->parameters(), {.lr = lr});
  optim::GradScaler scaler({.enabled = g_autocast == DType::f16});
  data::DataLoader train(d.train_images, d.train_labels,
                         {.batch_size = 128, .seed = seed, .device = kGpu, .mean = mnist::kMean, .std = mnist::kStd});
  const std::int64_t total = train.batches() * epochs, quarter = train.batches() / 4;
  std::unique_ptr<optim::LrScheduler> sched;
  if (cnn)
    sched = std::make_unique<optim::OneCycleLR>(opt, lr, total);
  else
    sched = std::make_unique<optim::CosineLR>(opt, lr, total);
  double trained = 0;
  for (int e = 0; e < epochs; ++e) {
    train.set_epoch(e);
    auto t0 = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; i < train.batches(); ++i) {
      data::Batch b = train.batch(i);
      Tensor loss = train_on(*net, opt, scaler, b.inputs.reshape({b.inputs.size(0), 1, 28, 28}), b.labels);
      opt.zero_grad();
      sched->step();
      if ((i + 1) % quarter == 0 || i + 1 == train.batches()) {
        (void)loss.item<float>();  // the clock stops when the GPU has finished these steps
        trained += seconds_since(t0);
        const double acc = accuracy(*net, d);
        if (acc >= target) {
          char buf[96];
          std::snprintf(buf, sizeof buf, "epoch %.2f, accuracy %.2f%%", e + (i + 1.0) / train.batches(), 100 * acc);
          note = buf;
          return trained;
        }
        t0 = std::chrono::steady_clock::now();
      }
    }
  }
  note = "not reached";
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  kiln::rt::set_quick_tier(false);  // steady-state kernels are timed, never a first use's quick builds
  std::string dir = std::getenv("KILN_MNIST_DIR") ? std::getenv("KILN_MNIST_DIR") : "data/mnist";
  int steps = 200;
  std::uint64_t seed = 0;
  std::string only, precision;
  bool tta = true, profile = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--no-tta")) tta = false;
    if (!std::strcmp(argv[i], "--profile")) profile = true;
    if (!std::strcmp(argv[i], "--tf32")) set_allow_tf32(true);
  }
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--only")) only = argv[i + 1];
    if (!std::strcmp(argv[i], "--data")) dir = argv[i + 1];
    if (!std::strcmp(argv[i], "--steps")) steps = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--seed")) seed = std::strtoull(argv[i + 1], nullptr, 10);
    if (!std::strcmp(argv[i], "--precision")) precision = argv[i + 1];
  }
  if (!precision.empty()) {
    if (precision != "f32" && precision != "tf32" && precision != "bf16" && precision != "f16") {
      std::fprintf(stderr, "bench_mnist: --precision must be f32, tf32, bf16 or f16, got '%s'\n", precision.c_str());
      return 2;
    }
    set_allow_tf32(precision == "tf32");
    set_allow_conv_tf32(precision == "tf32");
    if (precision == "bf16") g_autocast = DType::bf16;
    if (precision == "f16") g_autocast = DType::f16;
  }
  if (cuda_device_count() == 0) {
    std::printf("bench_mnist: no GPU, nothing to measure\n");
    return 77;
  }
  try {
    const bool mlp = only.empty() || only == "mlp", cnn = only.empty() || only == "cnn";
    if (profile) {
      for (const std::string model : {"mlp", "cnn"}) {
        if (!(model == "mlp" ? mlp : cnn)) continue;
        const CompileStats s = step_ms(model, 128, steps, seed, true, true, true).stats;
        std::printf("profile_%s_b128: %d replays of %zu kernels\n", model.c_str(), steps,
                    s.kernels_per_graph.empty() ? std::size_t{0} : s.kernels_per_graph.front());
      }
      return 0;
    }
    if (mlp) add_step_rows("mlp", 128, steps, seed);
    if (mlp) add_step_rows("mlp", 1024, steps, seed);
    if (cnn) add_step_rows("cnn", 128, steps, seed);
    if (tta && data::has_mnist(dir)) {
      const data::Mnist d = data::load_mnist(dir);
      std::string note;
      double s = 0;
      if (mlp) s = time_to_accuracy("mlp", 0.98, d, seed, note);
      if (mlp) g_rows.push_back({"tta_mlp_98", s, "s", note});
      if (cnn) s = time_to_accuracy("cnn", 0.99, d, seed, note);
      if (cnn) g_rows.push_back({"tta_cnn_99", s, "s", note});
    } else if (tta) {
      std::printf("no MNIST files in %s: time to accuracy not measured\n", dir.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_mnist: %s\n", e.what());
    return 1;
  }
  std::string json = "{\"bench\":\"kiln\",";
  if (!precision.empty()) json += "\"precision\":\"" + precision + "\",";
  json += "\"rows\":[";
  for (std::size_t i = 0; i < g_rows.size(); ++i) {
    const Row& r = g_rows[i];
    std::printf("%-16s %10.4f %-3s %s\n", r.name.c_str(), r.value, r.unit.c_str(), r.note.c_str());
    json.append(i ? "," : "") += "{\"name\":\"" + r.name + "\",\"value\":" + std::to_string(r.value) +
            ",\"unit\":\"" + r.unit + "\",\"note\":\"" + r.note + "\"}";
  }
  std::printf("%s]}\n", json.c_str());
  return 0;
}
