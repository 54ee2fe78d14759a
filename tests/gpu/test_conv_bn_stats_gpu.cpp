// A conv's channel sums serving the batch norm that reads its output (ConvStatsForBatchNorm):
// the direct kind (few input channels), the patch kind (small convs whose blocks take every
// channel) and the tile engine (the rest) sum the values they store; the engine's last block
// adds its partials into f64 totals, the other kinds' partials are added up by the batch norm
// (the pooled kernel's blocks a channel each, else a kernel before the apply kernel), which
// makes the statistics from them. Against the same ops without the scope: the conv's output
// bit for bit, the normalized (and pooled) output, running statistics, batch count and
// gradients within the rounding of statistics summed in another order; the running mean and
// variance against the CPU's statistics of the conv's output; no statistics kernel in a
// compiled step; an output written after the conv keeps its own statistics pass.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "conv_tf32.h"
#include "gpu_match.h"
#include "kiln/kiln.h"
#include "test_values.h"

using namespace kiln;
using kiln_test::check_match;
using kiln_test::f32_bits;
using kiln_test::kGpu;
using kiln_test::random_f64;
using kiln_test::values;

namespace {

struct ConvBnCase {
  const char* name;
  Shape x, w;
  DType t;
  bool tf32;
  bool pooled;
};

// A conv then a training batch norm (ReLU, and a 2x2 max pool when `pooled`), its backward
// from a fixed cotangent; with `sums` under a ConvStatsForBatchNorm.
struct ConvBnRun {
  Tensor conv_out, y, running_mean, running_var, tracked;
  std::vector<Tensor> grads;  // w, bn weight, bn bias
};

ConvBnRun run_conv_bn(const ConvBnCase& c, bool sums) {
  const DType p = DType::f32;  // beside 16-bit x too (autocast's mixed precision)
  const Tensor x = random_f64(c.x, 1, 1.0, 0.2).to(c.t).to(kGpu);
  const Tensor w = random_f64(c.w, 2, 0.3).to(c.t).to(kGpu).requires_grad_(true);
  const Tensor bw = random_f64({c.w[0]}, 3, 0.2, 1.0).to(p).to(kGpu).requires_grad_(true);
  const Tensor bb = random_f64({c.w[0]}, 4, 0.2).to(p).to(kGpu).requires_grad_(true);
  ConvBnRun r;
  r.running_mean = zeros({c.w[0]}, {.dtype = p, .device = kGpu});
  r.running_var = ones({c.w[0]}, {.dtype = p, .device = kGpu});
  r.tracked = zeros({}, {.dtype = DType::i64, .device = kGpu});
  Tensor y;
  {
    std::optional<ConvStatsForBatchNorm> scope;
    if (sums) scope.emplace();
    r.conv_out = conv2d(x, w);
    y = c.pooled ? batch_norm_max_pool2d(r.conv_out, r.running_mean, r.running_var, bw, bb, true, 0.1, 1e-5,
                                         Activation::relu, {2}, r.tracked)
                 : batch_norm(r.conv_out, r.running_mean, r.running_var, bw, bb, true, 0.1, 1e-5, Activation::relu,
                              r.tracked);
  }
  r.y = y.detach();
  const Tensor cot = random_f64(y.shape(), 5).to(c.t).to(kGpu);
  sum(mul(y, cot)).backward();
  r.grads = {w.grad(), bw.grad(), bb.grad()};
  return r;
}

const ConvBnCase kConvBnCases[] = {
    // The speedrun's and the cnn's first convs: the direct kind.
    {"speedrun conv1 bf16", {64, 1, 28, 28}, {24, 1, 5, 5}, DType::bf16, false, true},
    {"conv1 f32 exact", {16, 1, 14, 14}, {8, 1, 3, 3}, DType::f32, false, false},
    // The patch kind (small work, at most 32 channels out): a block's partials from the tile it
    // staged; an image's last band short of rows (13 - 2 = 11 rows in bands of 3).
    {"speedrun conv2 bf16", {64, 24, 12, 12}, {32, 24, 3, 3}, DType::bf16, false, true},
    {"speedrun conv2 TF32", {16, 24, 12, 12}, {32, 24, 3, 3}, DType::f32, true, true},
    {"short last band bf16", {128, 16, 13, 13}, {16, 16, 3, 3}, DType::bf16, false, false},
    // The tile engine, rows statistics in its epilogue; with 32 channels or fewer in tiles of
    // D^T, as their columns' sums (the cnn's conv2 at batch 128: work that fills the GPU).
    {"conv2 bf16", {64, 24, 12, 12}, {64, 24, 3, 3}, DType::bf16, false, true},
    {"cnn conv2 bf16", {128, 32, 14, 14}, {64, 32, 5, 5}, DType::bf16, false, true},
    {"32 channels, engine bf16", {128, 32, 14, 14}, {32, 32, 5, 5}, DType::bf16, false, true},
    {"conv2 TF32", {8, 32, 14, 14}, {64, 32, 3, 3}, DType::f32, true, false},
    {"1x1 bf16", {4, 32, 9, 9}, {48, 32, 1, 1}, DType::bf16, false, false},
};

// Relative tolerance for values normalized with statistics summed in another order.
double stats_order_tolerance(DType t) { return t == DType::f32 ? 1e-4 : 2e-2; }

}  // namespace

TEST_CASE("a conv's channel sums give its batch norm's statistics: values, running statistics and gradients") {
  for (const ConvBnCase& c : kConvBnCases) {
    CAPTURE(c.name);
    const kiln_test::ConvTF32 tf32(c.tf32);
    const ConvBnRun plain = run_conv_bn(c, false), summed = run_conv_bn(c, true);
    CHECK(f32_bits(summed.conv_out) == f32_bits(plain.conv_out));
    check_match(plain.y.to(Device::cpu()), summed.y, stats_order_tolerance(c.t), std::string(c.name) + " y");
    check_match(plain.running_mean.to(Device::cpu()), summed.running_mean, 1e-5, "running_mean");
    check_match(plain.running_var.to(Device::cpu()), summed.running_var, 1e-5, "running_var");
    CHECK(summed.tracked.item<std::int64_t>() == 1);
    for (std::size_t i = 0; i < 3; ++i)
      check_match(plain.grads[i].to(Device::cpu()), summed.grads[i], stats_order_tolerance(c.t) * 4,
                  std::string(c.name) + " grad " + std::to_string(i));

    // The running statistics against the CPU's: 0.9 * (0, 1) + 0.1 * (mean, unbiased variance)
    // of the conv's output as stored.
    const std::vector<double> v = values(summed.conv_out.to(Device::cpu()));
    const std::int64_t n = c.x[0], ch = c.w[0], hw = static_cast<std::int64_t>(v.size()) / (n * ch);
    std::vector<double> want_mean(static_cast<std::size_t>(ch)), want_var(static_cast<std::size_t>(ch));
    for (std::int64_t k = 0; k < ch; ++k) {
      double s = 0, q = 0;
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j = 0; j < hw; ++j) s += v[static_cast<std::size_t>((i * ch + k) * hw + j)];
      const double m = s / static_cast<double>(n * hw);
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j = 0; j < hw; ++j) {
          const double d = v[static_cast<std::size_t>((i * ch + k) * hw + j)] - m;
          q += d * d;
        }
      want_mean[static_cast<std::size_t>(k)] = 0.1 * m;
      want_var[static_cast<std::size_t>(k)] = 0.9 + 0.1 * q / static_cast<double>(n * hw - 1);
    }
    kiln_test::check_close(values(summed.running_mean.to(Device::cpu())), want_mean, 1e-5);
    kiln_test::check_close(values(summed.running_var.to(Device::cpu())), want_var, 1e-5);
  }
}

TEST_CASE("a conv's channel sums: an output written before its batch norm keeps the statistics pass") {
  const ConvBnCase c = kConvBnCases[0];
  const Tensor x = random_f64(c.x, 1, 1.0, 0.2).to(c.t).to(kGpu), w = random_f64(c.w, 2, 0.3).to(c.t).to(kGpu);
  auto normalized = [&](bool sums) {
    const Tensor rm = zeros({c.w[0]}, {.device = kGpu}), rv = ones({c.w[0]}, {.device = kGpu});
    std::optional<ConvStatsForBatchNorm> scope;
    if (sums) scope.emplace();
    Tensor y = conv2d(x, w);
    y.mul_(2.0);  // a new version: the sums taken over the old values no longer hold
    return std::pair{batch_norm(y, rm, rv, {}, {}, true).to(Device::cpu()), rm.to(Device::cpu())};
  };
  const auto [plain_y, plain_rm] = normalized(false);
  const auto [summed_y, summed_rm] = normalized(true);
  CHECK(f32_bits(summed_y) == f32_bits(plain_y));
  CHECK(f32_bits(summed_rm) == f32_bits(plain_rm));
}

TEST_CASE("nn::Sequential's Conv2d then BatchNorm2d: no statistics kernel in a compiled step, eager's bits") {
  Generator gen(90);
  auto net = std::make_shared<nn::Sequential>(nn::Conv2d(1, 24, {5}, {}, false, &gen), nn::BatchNorm2d(24), nn::ReLU(),
                                              nn::MaxPool2d({2}), nn::Conv2d(24, 64, {3}, {}, false, &gen),
                                              nn::BatchNorm2d(64), nn::ReLU(), nn::MaxPool2d({2}), nn::Flatten(),
                                              nn::Linear(64 * 5 * 5, 10, true, &gen));
  net->to(kGpu);
  const Tensor x = randn({32, 1, 28, 28}, {}, &gen).to(kGpu);
  const Tensor labels = randint(0, 10, {32}, {.dtype = DType::i64}, &gen).to(kGpu);
  optim::SGD opt(net->parameters(), {.lr = 0.05});
  auto fn = [&](const std::vector<Tensor>& in) {
    opt.zero_grad();
    AutocastGuard amp(DType::bf16);
    Tensor loss = cross_entropy((*net)(in[0]), in[1]);
    loss.backward();
    opt.step();
    return std::vector<Tensor>{loss.detach()};
  };
  // Eager steps, then the same steps compiled from the same start: the same losses bit for bit.
  const nn::NamedTensors start = net->state();
  std::vector<Tensor> copies;
  for (const auto& [name, t] : start) copies.push_back(t.detach().clone());
  std::vector<std::uint32_t> eager;
  for (int i = 0; i < 4; ++i) eager.push_back(f32_bits(fn({x, labels})[0])[0]);
  {
    NoGradGuard no_grad;
    for (std::size_t i = 0; i < start.size(); ++i) Tensor(start[i].second.detach()).copy_(copies[i]);
  }
  CompiledFunction step = compile(fn);
  std::vector<std::uint32_t> compiled;
  for (int i = 0; i < 4; ++i) compiled.push_back(f32_bits(step({x, labels})[0])[0]);
  CHECK(compiled == eager);
  const CompileStats st = step.stats();
  REQUIRE(st.kernel_names_per_graph.size() == 1);
  const std::map<std::string, std::size_t>& k = st.kernel_names_per_graph[0];
  CHECK(k.count("kiln_batch_norm_stats") == 0);
  CHECK(k.at("kiln_batch_norm_max_pool") == 2);
}
