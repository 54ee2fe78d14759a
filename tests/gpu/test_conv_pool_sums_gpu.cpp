// A conv's input gradient that is the whole pooled gradient of a batch norm with 2 x 2 max-pool
// windows parks that backward's sums (conv_patch.cu's POOL_SUMS, engine/ops/bn_pool_sums.h), and
// the batch norm runs dx alone: gradients as the CPU's, and as the GPU's own reduction gives them
// where the pooled output has another reader, in f32 (TF32) and bf16, with and without the ReLU
// and the parameters, windows that leave rows unpooled, channels of over 256 splits; a compiled
// step without the reduction, training as one with it.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "gpu_match.h"
#include "kiln/kiln.h"
#include "ops/bn_pool_sums.h"
#include "test_values.h"

using namespace kiln;
using kiln_test::check_match;
using kiln_test::kGpu;
using kiln_test::random_f64;

namespace {

struct PoolSumsCase {
  DType t;
  Shape x;  // the batch norm's input (N, C, H, W)
  bool relu, affine;
  std::int64_t padding;  // the conv's, over the pooled output
};

std::string pool_case_name(const PoolSumsCase& c) {
  return std::string(dtype_name(c.t)) + " " + shape_str(c.x) + (c.relu ? " relu" : "") + (c.affine ? " affine" : "") +
         " pad " + std::to_string(c.padding);
}

// Multiples of 0.5 from -1 to 1 (`half`) or whole numbers from -2 to 2: products and their sums
// exact in f32, TF32 and bf16, so the conv's input gradient is the same on every device.
Tensor small_steps(const Shape& s, int seed, bool half) {
  std::int64_t n = 1;
  for (std::int64_t d : s) n *= d;
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto step = static_cast<std::int64_t>((i * 7919 + static_cast<std::size_t>(seed) * 104729) % 5) - 2;
    v[i] = static_cast<double>(step) * (half ? 0.5 : 1.0);
  }
  return from_vector(v, s);
}

// Gradients of x, the batch norm's weight and bias (where affine) and w, for
// loss = sum(conv2d(batch_norm_max_pool2d(x), w) * cot), plus sum(pooled * 0) where `shared`:
// the same gradient, but the pooled output then has a second reader, so no conv parks the sums.
struct PoolSumsGrads {
  std::vector<Tensor> g;
  std::int64_t parked = 0;  // the batch norm took sums a conv parked
};
PoolSumsGrads run_pool_sums(const PoolSumsCase& c, Device d, bool shared) {
  const DType p = c.t == DType::bf16 ? DType::f32 : c.t;
  const std::int64_t C = c.x[1];
  Tensor x = random_f64(c.x, 11, 1.5, 0.2).to(c.t).to(d).requires_grad_();
  Tensor w = small_steps({32, C, 3, 3}, 12, true).to(c.t).to(d).requires_grad_();
  Tensor bw, bb;
  if (c.affine) {
    bw = random_f64({C}, 13, 0.3, 1.0).to(p).to(d).requires_grad_();
    bb = random_f64({C}, 14, 0.3).to(p).to(d).requires_grad_();
  }
  const Tensor rm = zeros({C}, {.dtype = p, .device = d}), rv = ones({C}, {.dtype = p, .device = d});
  const std::int64_t oh = c.x[2] / 2 + 2 * c.padding - 2, ow = c.x[3] / 2 + 2 * c.padding - 2;
  const Tensor cot = small_steps({c.x[0], 32, oh, ow}, 15, false).to(c.t).to(d);
  const std::int64_t before = bn_pool_sums::taken_count();
  const Tensor pooled =
      batch_norm_max_pool2d(x, rm, rv, bw, bb, true, 0.1, 1e-5, c.relu ? Activation::relu : Activation::none, {2});
  Tensor loss = sum(mul(conv2d(pooled, w, {}, {.padding = {c.padding}}), cot));
  if (shared) loss = add(loss, sum(mul(pooled, 0.0)));
  loss.backward();
  PoolSumsGrads r{{x.grad()}, bn_pool_sums::taken_count() - before};
  if (c.affine) r.g.insert(r.g.end(), {bw.grad(), bb.grad()});
  r.g.push_back(w.grad());  // last: the conv's own, in TF32 from the pooled values
  return r;
}

// Parked sums on for a test case (KILN_POOL_SUMS may have turned them off), as they were after.
struct PoolSumsOn {
  bool was = bn_pool_sums::enabled();
  PoolSumsOn() { bn_pool_sums::set_enabled(true); }
  ~PoolSumsOn() { bn_pool_sums::set_enabled(was); }
};

const PoolSumsCase kPoolSumsCases[] = {
    {DType::f32, {8, 24, 24, 24}, true, true, 0},   // the speedrun's first layer, smaller
    {DType::f32, {4, 16, 25, 22}, false, true, 1},  // a row past the windows; x's rows copied in pairs
    {DType::f32, {6, 8, 12, 12}, true, false, 1},
    {DType::f32, {64, 8, 12, 12}, true, true, 0},  // past 256 of dx's splits a channel
    {DType::bf16, {16, 24, 24, 24}, true, true, 0},
    {DType::bf16, {3, 16, 17, 20}, false, false, 1},
    {DType::bf16, {80, 8, 10, 10}, true, true, 1},
};

}  // namespace

TEST_CASE("a conv's input gradient parks its pooled batch norm's sums: the gradients as the CPU's") {
  const PoolSumsOn on;
  for (const PoolSumsCase& c : kPoolSumsCases) {
    if (c.t != DType::f32) continue;  // bf16's rounding moves ties between a window's values
    CAPTURE(pool_case_name(c));
    const PoolSumsGrads gpu = run_pool_sums(c, kGpu, false);
    CHECK(gpu.parked == 1);
    const PoolSumsGrads cpu = run_pool_sums(c, Device::cpu(), false);
    CHECK(cpu.parked == 0);
    REQUIRE(gpu.g.size() == cpu.g.size());
    // The batch norm's from the same pooled gradient (exact in TF32); its parameters' are sums
    // over a channel that can cancel to near zero (0.006 of terms that add to about 30), so they
    // carry f32's summation error of the terms. The conv's weight gradient from the pooled values
    // rounded to TF32.
    check_match(cpu.g[0], gpu.g[0], 1e-4, "x's grad");
    for (std::size_t i = 1; i + 1 < gpu.g.size(); ++i)
      check_match(cpu.g[i], gpu.g[i], 5e-4, "grad " + std::to_string(i));
    check_match(cpu.g.back(), gpu.g.back(), 2e-2, "w's grad");
  }
}

TEST_CASE("a conv's input gradient parks its pooled batch norm's sums: as the batch norm's own reduction") {
  const PoolSumsOn on;
  for (const PoolSumsCase& c : kPoolSumsCases) {
    CAPTURE(pool_case_name(c));
    const PoolSumsGrads parked = run_pool_sums(c, kGpu, false), own = run_pool_sums(c, kGpu, true);
    CHECK(parked.parked == 1);
    CHECK(own.parked == 0);
    // The same terms, summed over the channel in another order.
    const double tol = c.t == DType::f32 ? 1e-4 : 2e-2;
    for (std::size_t i = 0; i < own.g.size(); ++i)
      check_match(own.g[i].to(Device::cpu()), parked.g[i], tol, "grad " + std::to_string(i));
  }
}

TEST_CASE("a pooled batch norm in eval, or with other windows, takes no parked sums") {
  const PoolSumsOn on;
  const Tensor x = random_f64({4, 16, 12, 12}, 21).to(DType::bf16).to(kGpu).requires_grad_();
  const Tensor w = random_f64({16, 16, 3, 3}, 22, 0.2).to(DType::bf16).to(kGpu).requires_grad_();
  const Tensor rm = zeros({16}, {.device = kGpu}), rv = ones({16}, {.device = kGpu});
  const std::int64_t before = bn_pool_sums::taken_count();
  for (const auto& [training, k] : {std::pair{false, std::vector<std::int64_t>{2}}, {true, {3}}, {true, {2, 3}}}) {
    const Tensor pooled = batch_norm_max_pool2d(x, rm, rv, {}, {}, training, 0.1, 1e-5, Activation::relu, k);
    sum(conv2d(pooled, w, {}, {.padding = {1}})).backward();
    REQUIRE(x.grad().defined());
  }
  CHECK(bn_pool_sums::taken_count() == before);
}

TEST_CASE("a compiled step whose pooled batch norm feeds a conv runs no reduction kernel for it") {
  const PoolSumsOn restore;
  // The same net and batch trained with the parked sums and without.
  auto train = [](bool parked, std::map<std::string, std::size_t>& kernels) {
    bn_pool_sums::set_enabled(parked);
    Generator gen(90);
    nn::Sequential net(nn::Conv2d(1, 16, {3}, {.padding = {1}}, true, &gen), nn::BatchNorm2d(16), nn::ReLU(),
                       nn::MaxPool2d({2}), nn::Conv2d(16, 32, {3}, {.padding = {1}}, true, &gen), nn::BatchNorm2d(32),
                       nn::ReLU(), nn::MaxPool2d({2}), nn::Flatten(), nn::Linear(32 * 7 * 7, 10, true, &gen));
    net.to(kGpu);
    optim::SGD opt(net.parameters(), {.lr = 0.01});
    CompiledFunction step = compile([&](const std::vector<Tensor>& in) {
      opt.zero_grad();
      Tensor loss = cross_entropy(net(in[0]), in[1]);
      loss.backward();
      opt.step();
      return std::vector<Tensor>{loss.detach()};
    });
    const Tensor x = randn({32, 1, 28, 28}, {}, &gen).to(kGpu);
    const Tensor labels = randint(0, 10, {32}, {.dtype = DType::i64}, &gen).to(kGpu);
    std::vector<double> losses;
    for (int i = 0; i < 6; ++i) losses.push_back(step({x, labels})[0].item<float>());
    const CompileStats st = step.stats();
    REQUIRE(st.kernel_names_per_graph.size() == 1);
    kernels = st.kernel_names_per_graph[0];
    return losses;
  };
  std::map<std::string, std::size_t> with, without;
  const std::vector<double> a = train(true, with), b = train(false, without);
  // The second batch norm's gradient comes from the linear layer: it keeps its reduction.
  CHECK(with["kiln_batch_norm_max_pool_backward_reduce"] == 1);
  CHECK(without["kiln_batch_norm_max_pool_backward_reduce"] == 2);
  CHECK(with["kiln_batch_norm_max_pool_backward_dx"] == 2);
  CHECK(without["kiln_batch_norm_max_pool_backward_dx"] == 2);
  // The same training, up to the rounding of the channels' sums.
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(a[i] - b[i]) <= 1e-4 * (1 + std::abs(b[i])));
  }
}
