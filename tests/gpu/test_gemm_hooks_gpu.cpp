// The GEMM tile engine's hooks against the unfused ops: an epilogue gives the bits of the plain
// product followed by the same expression as a pointwise op (or the same f32 add or multiply),
// a prologue the bits of the product of A transformed first, and the statistics' partials sum
// to the sums and squares of the stored output (their order differs: within 1e-5).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/generated/gemm/gemm_plan.h"
#include "element_bytes.h"
#include "kiln/kiln.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/memory.h"

using namespace kiln;
using kernels::GemmEpilogueHook;
using kernels::GemmGeometry;
using kernels::GemmLaunch;
using kernels::GemmMath;
using kernels::GemmPrologueHook;
using kernels::GemmTile;
using kernels::HookIndex;
using kernels::HookStats;

namespace {

// Elements of one dtype in host memory, with their device copy.
struct HookBuffer {
  DType dt;
  std::vector<unsigned char> host;
  rt::DeviceBuffer dev;
  HookBuffer(DType d, std::int64_t count) : dt(d), host(static_cast<std::size_t>(count) * dtype_size(d)) {}
  std::int64_t count() const { return static_cast<std::int64_t>(host.size() / dtype_size(dt)); }
  double at(std::int64_t e) const { return kiln_test::get_element(dt, host.data(), e); }
  void set(std::int64_t e, double v) { kiln_test::set_element(dt, host.data(), e, v); }
  rt::DevicePtr upload() {
    const rt::Stream& s = rt::default_stream(0);
    dev = rt::DeviceBuffer(host.size(), s);
    rt::copy_to_device(dev.ptr(), host.data(), host.size(), s);
    return dev.ptr();
  }
  void download() {
    const rt::Stream& s = rt::default_stream(0);
    rt::copy_to_host(host.data(), dev.ptr(), host.size(), s);
    s.synchronize();
  }
  Tensor tensor(const Shape& shape) const { return from_data(host.data(), shape, dt, Device::cuda(0)); }
};

HookBuffer random_buffer(DType dt, std::int64_t count, std::mt19937& rng, double lo = -1, double hi = 1) {
  HookBuffer b(dt, count);
  std::uniform_real_distribution<double> u(lo, hi);
  for (std::int64_t e = 0; e < count; ++e) b.set(e, u(rng));
  return b;
}

bool hopper() {
  if (kernels::gemm_target(0).arch == 90) return true;
  MESSAGE("the wgmma kernels need sm_90; this GPU is sm_" << kernels::gemm_target(0).arch);
  return false;
}

GemmLaunch planned(const GemmGeometry& g, GemmTile tile = {}) {
  const auto l = kernels::plan(kernels::GemmKernel::wgmma, g, kernels::gemm_target(0), tile);
  REQUIRE(l);
  return *l;
}

// D of g's output dtype, downloaded after the launch with `ops` (a, b and d filled in here).
HookBuffer run(const GemmLaunch& l, HookBuffer& a, HookBuffer& b, kernels::GemmOperands ops, HookBuffer d) {
  ops.a = a.dev.ptr(), ops.b = b.dev.ptr(), ops.d = d.upload(), ops.stream = &rt::default_stream(0);
  kernels::launch(l, ops);
  d.download();
  return d;
}

void check_same_bits(const HookBuffer& got, const HookBuffer& want) {
  REQUIRE(got.host.size() == want.host.size());
  std::int64_t differ = 0, first = -1;
  for (std::int64_t e = 0; e < got.count(); ++e)
    if (std::memcmp(&got.host[static_cast<std::size_t>(e) * dtype_size(got.dt)],
                    &want.host[static_cast<std::size_t>(e) * dtype_size(got.dt)], dtype_size(got.dt)) != 0) {
      if (first < 0) first = e;
      ++differ;
    }
  CAPTURE(first);
  CHECK(differ == 0);
}

// A GPU tensor's elements, copied to the host.
HookBuffer host_copy(const Tensor& t) {
  const Tensor c = contiguous(t).to(Device::cpu());
  HookBuffer b(c.dtype(), c.numel());
  std::memcpy(b.host.data(), c.data_ptr(), b.host.size());
  return b;
}

GemmEpilogueHook to_f32() {
  GemmEpilogueHook e;
  e.out = DType::f32;
  return e;
}

}  // namespace

TEST_CASE("GEMM epilogue hooks give the bits of the product followed by the unfused ops") {
  if (!hopper()) return;
  std::mt19937 rng(7);
  const std::int64_t m = 260, n = 150, k = 136;
  for (GemmMath math : {GemmMath::tf32, GemmMath::bf16}) {
    CAPTURE(kernels::math_name(math));
    const DType in = kernels::input_dtype(math);
    HookBuffer a = random_buffer(in, m * k, rng), b = random_buffer(in, n * k, rng);
    a.upload(), b.upload();
    // The plain product in f32, with the tile each fused launch uses (the sums' order is the tile's).
    GemmGeometry plain{m, n, k, k, k, n, math};
    plain.hooks.epilogue = to_f32();
    auto product = [&](GemmTile tile) { return run(planned(plain, tile), a, b, {}, HookBuffer(DType::f32, m * n)); };
    const HookBuffer d0 = product({});
    const Tensor t0 = d0.tensor({m, n});

    // A chain with a param, a column vector and a function: gelu(acc * 0.5 + bias).
    HookBuffer bias = random_buffer(DType::f32, n, rng);
    GemmGeometry g = plain;
    g.hooks.epilogue = GemmEpilogueHook{"kiln::math::gelu(acc * C(p0) + bias)", {{"bias", DType::f32}}, {0.5}, DType::f32};
    kernels::GemmOperands ops;
    ops.epilogue_inputs[0] = bias.upload();
    for (GemmTile tile : {GemmTile{}, GemmTile{64, 128}}) {
      CAPTURE(tile.text());
      const HookBuffer fused = run(planned(g, tile), a, b, ops, HookBuffer(DType::f32, m * n));
      const Tensor unfused =
          pointwise("hook_gelu_bias", "gelu(a * 0.5 + b)", {product(tile).tensor({m, n}), bias.tensor({1, n})});
      check_same_bits(fused, host_copy(unfused));
    }

    // A residual matrix (padded rows) added, then ReLU, stored in the inputs' dtype: the unfused
    // ops add in f32 and cast once.
    const std::int64_t ld = n + 10;
    HookBuffer res = random_buffer(in, m * ld, rng);
    g.hooks.epilogue = GemmEpilogueHook{"kiln::math::relu(acc + res)", {{"res", in, HookIndex::element, ld}}};
    ops.epilogue_inputs[0] = res.upload();
    const HookBuffer fused = run(planned(g), a, b, ops, HookBuffer(in, m * n));
    const Tensor res_view = slice(res.tensor({m, ld}), 1, 0, n);
    check_same_bits(fused, host_copy(relu(add(t0, res_view)).to(in)));

    // Accumulating into an f32 gradient: D + acc, one f32 add.
    HookBuffer before = random_buffer(DType::f32, m * n, rng);
    g.hooks.epilogue = to_f32();
    g.hooks.epilogue->accumulate = true;
    HookBuffer start(DType::f32, m * n);
    start.host = before.host;
    const HookBuffer summed = run(planned(g), a, b, {}, std::move(start));
    HookBuffer sum_want(DType::f32, m * n);
    for (std::int64_t e = 0; e < m * n; ++e)
      sum_want.set(e, static_cast<float>(static_cast<float>(before.at(e)) + static_cast<float>(d0.at(e))));
    check_same_bits(summed, sum_want);
  }
}

TEST_CASE("GEMM epilogue hooks read per-problem row vectors in a batch that shares A") {
  if (!hopper()) return;
  std::mt19937 rng(8);
  const std::int64_t m = 96, n = 200, k = 72, batch = 3;
  HookBuffer a = random_buffer(DType::bf16, m * k, rng), b = random_buffer(DType::bf16, batch * n * k, rng);
  a.upload(), b.upload();
  GemmGeometry g{m, n, k, k, k, n, GemmMath::bf16};
  g.batch = batch, g.batch_b = n * k, g.batch_d = m * n;
  g.hooks.epilogue = to_f32();
  const HookBuffer d0 = run(planned(g), a, b, {}, HookBuffer(DType::f32, batch * m * n));
  HookBuffer scale = random_buffer(DType::f32, batch * m, rng);
  g.hooks.epilogue = GemmEpilogueHook{"acc * rs", {{"rs", DType::f32, HookIndex::row, 0, m}}, {}, DType::f32};
  kernels::GemmOperands ops;
  ops.epilogue_inputs[0] = scale.upload();
  const HookBuffer fused = run(planned(g), a, b, ops, HookBuffer(DType::f32, batch * m * n));
  HookBuffer want(DType::f32, batch * m * n);
  for (std::int64_t z = 0; z < batch; ++z)
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        const std::int64_t e = (z * m + i) * n + j;
        want.set(e, static_cast<float>(static_cast<float>(d0.at(e)) * static_cast<float>(scale.at(z * m + i))));
      }
  check_same_bits(fused, want);
}

TEST_CASE("GEMM epilogue statistics: partials sum to the stored output's sums and squares, the same each run") {
  if (!hopper()) return;
  std::mt19937 rng(9);
  const std::int64_t m = 300, n = 270, k = 96, batch = 2;
  HookBuffer a = random_buffer(DType::bf16, batch * m * k, rng), b = random_buffer(DType::bf16, n * k, rng);
  a.upload(), b.upload();
  GemmGeometry plain{m, n, k, k, k, n, GemmMath::bf16};
  plain.batch = batch, plain.batch_a = m * k, plain.batch_d = m * n;
  for (HookStats s : {HookStats::rows, HookStats::columns})
    for (GemmTile tile : {GemmTile{128, 128}, GemmTile{64, 128}, GemmTile{128, 256}}) {
      CAPTURE(static_cast<int>(s));
      CAPTURE(tile.text());
      const HookBuffer d0 = run(planned(plain, tile), a, b, {}, HookBuffer(DType::bf16, batch * m * n));
      GemmGeometry g = plain;
      g.hooks.epilogue = GemmEpilogueHook{};
      g.hooks.epilogue->stats = s;
      const GemmLaunch l = planned(g, tile);
      const kernels::GemmStatsShape shape = kernels::stats_shape(l);
      HookBuffer stats(DType::f32, shape.floats()), again(DType::f32, shape.floats());
      for (std::int64_t e = 0; e < stats.count(); ++e) stats.set(e, std::nan(""));  // every partial is written
      kernels::GemmOperands ops;
      ops.stats = stats.upload();
      check_same_bits(run(l, a, b, ops, HookBuffer(DType::bf16, batch * m * n)), d0);
      stats.download();
      ops.stats = again.upload();
      (void)run(l, a, b, ops, HookBuffer(DType::bf16, batch * m * n));
      again.download();
      check_same_bits(again, stats);
      // Channels are rows (summed over columns and problems) or columns (over rows and problems).
      const std::int64_t channels = s == HookStats::rows ? m : n;
      REQUIRE(shape.channels == channels);
      double worst = 0;
      for (std::int64_t c = 0; c < channels; ++c) {
        double sum = 0, sq = 0, got_sum = 0, got_sq = 0;
        for (std::int64_t z = 0; z < batch; ++z)
          for (std::int64_t o = 0; o < (s == HookStats::rows ? n : m); ++o) {
            const double v = d0.at(z * m * n + (s == HookStats::rows ? c * n + o : o * n + c));
            sum += v, sq += v * v;
          }
        for (std::int64_t p = 0; p < shape.parts; ++p) {
          got_sum += stats.at(p * channels + c);
          got_sq += stats.at((shape.parts + p) * channels + c);
        }
        worst = std::max({worst, std::abs(got_sum - sum) / (sq + 1), std::abs(got_sq - sq) / (sq + 1)});
      }
      CHECK(worst < 1e-5);
    }
}

TEST_CASE("GEMM prologue hooks give the bits of the product of A transformed first") {
  if (!hopper()) return;
  std::mt19937 rng(10);
  const std::int64_t m = 200, n = 136, k = 136;
  struct Case {
    GemmMath math;
    bool a_mn;
    std::int64_t batch;
  };
  for (const Case& c : {Case{GemmMath::bf16, false, 1}, Case{GemmMath::bf16, true, 1}, Case{GemmMath::f16, false, 2},
                        Case{GemmMath::tf32, false, 1}}) {
    CAPTURE(kernels::math_name(c.math));
    CAPTURE(c.a_mn);
    const DType in = kernels::input_dtype(c.math);
    const std::int64_t lda = c.a_mn ? m : k;
    HookBuffer a = random_buffer(in, c.batch * m * k, rng, -2, 2), b = random_buffer(in, n * k, rng);
    HookBuffer scale = random_buffer(DType::f32, c.batch * k, rng, 0.5, 1.5), shift = random_buffer(DType::f32, c.batch * k, rng);
    // A transformed on the host with the same arithmetic: one fused multiply-add, ReLU, one rounding.
    HookBuffer ready(in, c.batch * m * k);
    for (std::int64_t z = 0; z < c.batch; ++z)
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t kk = 0; kk < k; ++kk) {
          const std::int64_t e = z * m * k + (c.a_mn ? kk * lda + i : i * lda + kk);
          const float v = std::fma(static_cast<float>(a.at(e)), static_cast<float>(scale.at(z * k + kk)),
                                   static_cast<float>(shift.at(z * k + kk)));
          ready.set(e, v > 0.f || v != v ? v : 0.f);
        }
    a.upload(), b.upload(), ready.upload();
    GemmGeometry g{m, n, k, lda, k, n, c.math, kernels::GemmEpilogue::none, c.a_mn};
    if (c.batch > 1) g.batch = c.batch, g.batch_a = m * k, g.batch_d = m * n;
    const GemmGeometry unfused = g;
    g.hooks.prologue = GemmPrologueHook{"kiln::math::relu(a * scale + shift)",
                                        {{"scale", DType::f32, HookIndex::column, 0, c.batch > 1 ? k : 0},
                                         {"shift", DType::f32, HookIndex::column, 0, c.batch > 1 ? k : 0}}};
    kernels::GemmOperands ops;
    ops.prologue_inputs[0] = scale.upload();
    ops.prologue_inputs[1] = shift.upload();
    for (GemmTile tile : {GemmTile{}, GemmTile{64, 128}}) {
      CAPTURE(tile.text());
      const HookBuffer want = run(planned(unfused, tile), ready, b, {}, HookBuffer(in, c.batch * m * n));
      check_same_bits(run(planned(g, tile), a, b, ops, HookBuffer(in, c.batch * m * n)), want);
    }
  }
}
