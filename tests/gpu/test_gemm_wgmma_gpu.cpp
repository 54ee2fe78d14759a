// The generated GEMM kernels (backend/cuda/generated/gemm: wgmma, mma.sync on any GPU from
// sm_80, the exact-f32 FFMA kind and the row kind anywhere) against a double-precision product of the same stored
// inputs, computed here: every arithmetic, every tile the tuner may pick, every epilogue, shapes with tails in m, n and
// k, a 10-wide output and padded row strides.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cuda/generated/gemm/gemm_plan.h"
#include "element_bytes.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/kernel_plan.h"
#include "kiln/runtime/memory.h"

using namespace kiln;
using kernels::GemmEpilogue;
using kernels::GemmGeometry;
using kernels::GemmMath;

namespace {

// `count` elements of one dtype in host memory, read and written through double.
struct HostBuffer {
  DType dt;
  std::vector<unsigned char> bytes;
  HostBuffer(DType d, std::int64_t count) : dt(d), bytes(static_cast<std::size_t>(count) * dtype_size(d)) {}
  double at(std::int64_t e) const { return kiln_test::get_element(dt, bytes.data(), e); }
  void set(std::int64_t e, double v) { kiln_test::set_element(dt, bytes.data(), e, v); }
};

// Element (i, kk) of an operand of `rows` x k, K-major (rows of ld) or MN-major (k rows of ld).
std::int64_t element(bool mn, std::int64_t ld, std::int64_t i, std::int64_t kk) {
  return mn ? kk * ld + i : i * ld + kk;
}

// Largest |got - want| over the largest |want|, for every problem of the batch. With
// `split_exact`, every product is +-(1 + m 2^-12) (m in -1..1), the remainder on A's side at even
// k and B's at odd k, so that hi*hi + lo*hi + hi*lo is exact and any sum of them is too: an exact
// f32 kernel that dropped or repeated one of its three products anywhere would be off.
double check_launch(const kernels::GemmLaunch& l, std::uint32_t seed, bool split_exact = false,
                    std::vector<std::uint8_t>* result = nullptr) {
  const GemmGeometry& g = l.g;
  const DType t = kernels::input_dtype(g.math);
  const std::int64_t sa = g.batch > 1 ? g.batch_a : 0, sb = g.batch > 1 ? g.batch_b : 0,
                     sd = g.batch > 1 ? g.batch_d : 0;
  const std::int64_t span_a = (g.a_mn ? g.k : g.m) * g.lda, span_b = (g.b_mn ? g.k : g.n) * g.ldb;
  HostBuffer a(t, (g.batch - 1) * sa + span_a), b(t, (g.batch - 1) * sb + span_b);
  HostBuffer d(t, (g.batch - 1) * sd + g.m * g.ldd), bias(t, g.n);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::uniform_int_distribution<int> m3(-1, 1);
  auto value = [&](bool split) {
    if (!split_exact) return u(rng);
    return (m3(rng) < 0 ? -1.0 : 1.0) * (split ? 1.0 + m3(rng) * 0x1p-12 : 1.0);
  };
  // Every element a problem must not read is huge: reading one shows in the result.
  for (std::int64_t e = 0; e < static_cast<std::int64_t>(a.bytes.size() / dtype_size(t)); ++e) a.set(e, 1e30);
  for (std::int64_t e = 0; e < static_cast<std::int64_t>(b.bytes.size() / dtype_size(t)); ++e) b.set(e, 1e30);
  for (std::int64_t z = 0; z < g.batch; ++z)
    for (std::int64_t kk = 0; kk < g.k; ++kk) {
      for (std::int64_t i = 0; i < g.m; ++i) a.set(z * sa + element(g.a_mn, g.lda, i, kk), value(kk % 2 == 0));
      for (std::int64_t j = 0; j < g.n; ++j) b.set(z * sb + element(g.b_mn, g.ldb, j, kk), value(kk % 2 == 1));
    }
  for (std::int64_t j = 0; j < g.n; ++j) bias.set(j, u(rng));
  const rt::Stream& s = rt::default_stream(0);
  auto upload = [&](const HostBuffer& h) {
    rt::DeviceBuffer buf(h.bytes.size(), s);
    rt::copy_to_device(buf.ptr(), h.bytes.data(), h.bytes.size(), s);
    return buf;
  };
  rt::DeviceBuffer da = upload(a), db = upload(b), dd = upload(d), dbias = upload(bias);
  kernels::launch(l, {da.ptr(), db.ptr(), dd.ptr(), g.epilogue == GemmEpilogue::none ? 0 : dbias.ptr(), &s});
  const HostBuffer before = d;
  rt::copy_to_host(d.bytes.data(), dd.ptr(), d.bytes.size(), s);
  s.synchronize();
  if (result) *result = d.bytes;
  // The operands as doubles, each problem's rows along k, so that the reference loop is plain.
  auto rows_of = [&](const HostBuffer& h, bool mn, std::int64_t ld, std::int64_t stride, std::int64_t rows) {
    std::vector<double> out(static_cast<std::size_t>(g.batch * rows * g.k));
    for (std::int64_t z = 0; z < g.batch; ++z)
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t kk = 0; kk < g.k; ++kk)
          out[static_cast<std::size_t>((z * rows + i) * g.k + kk)] = h.at(z * stride + element(mn, ld, i, kk));
    return out;
  };
  const std::vector<double> ra = rows_of(a, g.a_mn, g.lda, sa, g.m), rb = rows_of(b, g.b_mn, g.ldb, sb, g.n);
  double worst = 0, scale = 0;
  std::vector<bool> written(d.bytes.size() / dtype_size(t), false);
  for (std::int64_t z = 0; z < g.batch; ++z)
    for (std::int64_t i = 0; i < g.m; ++i)
      for (std::int64_t j = 0; j < g.n; ++j) {
        const double* pa = &ra[static_cast<std::size_t>((z * g.m + i) * g.k)];
        const double* pb = &rb[static_cast<std::size_t>((z * g.n + j) * g.k)];
        double want = 0;
        for (std::int64_t kk = 0; kk < g.k; ++kk) want += pa[kk] * pb[kk];
        if (g.epilogue != GemmEpilogue::none) want += bias.at(j);
        if (g.epilogue == GemmEpilogue::relu_bias) want = std::max(want, 0.0);
        const std::int64_t e = z * sd + i * g.ldd + j;
        written[static_cast<std::size_t>(e)] = true;
        worst = std::max(worst, std::abs(d.at(e) - want));
        scale = std::max(scale, std::abs(want));
      }
  for (std::size_t e = 0; e < written.size(); ++e)  // the rest of D stays as it was
    if (!written[e]) REQUIRE(d.at(static_cast<std::int64_t>(e)) == before.at(static_cast<std::int64_t>(e)));
  return worst / std::max(scale, 1e-30);
}

// Exact f32 (three TF32 products of split operands): TF32 alone misses it a hundredfold. Over
// 4096 k in one tile its sums drift to 3e-5 of the largest (the tensor cores' f32 adds); the
// exactness test below shows that no product is missing.
double tolerance(GemmMath m) { return m == GemmMath::bf16 ? 1.5e-2 : m == GemmMath::f32 ? 5e-5 : 4e-3; }

// The kinds that plan `g` here: wgmma on sm_90, mma.sync from sm_80 on, FFMA for exact f32.
std::vector<kernels::GemmKernel> kinds_for(const GemmGeometry& g, const kernels::GemmTarget& tgt) {
  std::vector<kernels::GemmKernel> out;
  for (kernels::GemmKernel k : {kernels::GemmKernel::wgmma, kernels::GemmKernel::mma_sync, kernels::GemmKernel::ffma})
    if (kernels::plan(k, g, tgt)) out.push_back(k);
  return out;
}

// Whether the wgmma kernels can run here; says why not where they cannot.
bool on_hopper(const kernels::GemmTarget& tgt) {
  if (tgt.arch != 90) MESSAGE("the wgmma kernels need sm_90; this GPU is sm_" << tgt.arch);
  return tgt.arch == 90;
}

// The heuristic's launch of `g` by kind `k` and every alternative tile that applies.
std::vector<kernels::GemmLaunch> launches_of(const GemmGeometry& g, const kernels::GemmTarget& tgt,
                                             kernels::GemmKernel k = kernels::GemmKernel::wgmma) {
  const auto h = kernels::plan(k, g, tgt);
  REQUIRE(h);
  std::vector<kernels::GemmLaunch> out{*h};
  for (kernels::GemmTile tile : kernels::alternatives(*h, tgt))
    if (auto l = kernels::plan(k, g, tgt, tile)) out.push_back(*l);
  return out;
}

// Compiles the launches' kernels at once on the prefetch threads, as the tuner does, instead of
// one NVRTC compile after another as each first runs: a shape-only pass plans them (one small
// buffer stands for every operand; nothing runs) and records what they load.
void prefetch(const std::vector<kernels::GemmLaunch>& launches) {
  const rt::Stream& s = rt::default_stream(0);
  const rt::DeviceBuffer any(4096, s);
  std::vector<rt::KernelRequest> requests;
  {
    rt::ShapeOnlyPass pass;
    for (const kernels::GemmLaunch& l : launches)
      kernels::launch(l, {any.ptr(), any.ptr(), any.ptr(), l.g.epilogue == GemmEpilogue::none ? 0 : any.ptr(), &s});
    requests = pass.requests();
  }
  rt::prefetch(std::move(requests));
  rt::wait_for_prefetch();
}

// Checks every launch of `g` against the product in f64, seeding each from `runs`, which
// counts the launches checked.
void check_launches(const GemmGeometry& g, const kernels::GemmTarget& tgt, std::uint32_t seed0, int& runs,
                    kernels::GemmKernel k = kernels::GemmKernel::wgmma) {
  const std::vector<kernels::GemmLaunch> launches = launches_of(g, tgt, k);
  prefetch(launches);
  for (const kernels::GemmLaunch& l : launches) {
    CAPTURE(g.text());
    CAPTURE(l.text());
    CHECK(check_launch(l, seed0 + static_cast<std::uint32_t>(runs)) <= tolerance(g.math));
    ++runs;
  }
}

// check_launches for each problem, every launch compiled at once first; each problem has at
// least `min_launches`.
void check_problems(const std::vector<GemmGeometry>& problems, const kernels::GemmTarget& tgt, std::uint32_t seed0,
                    kernels::GemmKernel k = kernels::GemmKernel::wgmma, std::size_t min_launches = 1) {
  std::vector<kernels::GemmLaunch> every;
  for (const GemmGeometry& g : problems) {
    const std::vector<kernels::GemmLaunch> ls = launches_of(g, tgt, k);
    CHECK(ls.size() >= min_launches);
    every.insert(every.end(), ls.begin(), ls.end());
  }
  prefetch(every);
  int runs = 0;
  for (const GemmGeometry& g : problems) check_launches(g, tgt, seed0, runs, k);
  CHECK(runs == static_cast<int>(every.size()));
  MESSAGE(runs << " launches checked");
}

}  // namespace

TEST_CASE("generated GEMMs match a double-precision product in every arithmetic, tile and epilogue") {
  const kernels::GemmTarget tgt = kernels::gemm_target(0);
  if (!on_hopper(tgt)) return;
  struct Shape {
    std::int64_t m, n, k, pad_a, pad_d;
  };
  const Shape shapes[] = {{128, 128, 64, 0, 0},    // one tile, one k step
                          {260, 150, 136, 8, 3},   // tails in m, n and k; padded rows, odd ldd
                          {1024, 10, 4096, 0, 0},  // the wide MLP's output layer (split-K among its tiles)
                          {77, 200, 8, 0, 1}};     // k shorter than one k tile
  std::vector<GemmGeometry> problems;
  for (GemmMath math : {GemmMath::bf16, GemmMath::f16, GemmMath::tf32, GemmMath::f32})
    for (const Shape& sh : shapes)
      for (GemmEpilogue e : {GemmEpilogue::none, GemmEpilogue::bias, GemmEpilogue::relu_bias})
        problems.push_back({sh.m, sh.n, sh.k, sh.k + sh.pad_a, sh.k, sh.n + sh.pad_d, math, e});
  check_problems(problems, tgt, 0);
}

// An MN-major A in TF32 and exact f32, staged K-major per launch: with B K-major, and with B
// MN-major too (read into registers), a weight gradient's layout. A tail in every dimension, and
// the mlp's first dW.
TEST_CASE("generated TF32 and exact-f32 GEMMs with A MN-major match a double-precision product") {
  const kernels::GemmTarget tgt = kernels::gemm_target(0);
  if (!on_hopper(tgt)) return;
  std::vector<GemmGeometry> problems;
  for (GemmMath math : {GemmMath::tf32, GemmMath::f32}) {
    problems.push_back({200, 136, 264, 200, 264, 139, math, GemmEpilogue::bias, true, false});
    problems.push_back({200, 136, 264, 200, 136, 139, math, GemmEpilogue::none, true, true});
    problems.push_back({512, 784, 128, 512, 784, 784, math, GemmEpilogue::none, true, true});
  }
  check_problems(problems, tgt, 900, kernels::GemmKernel::wgmma, 2);  // the heuristic's tile and others
}

// The mma.sync kind (sm_80's path) runs on any GPU from sm_80 on, so it is checked here too:
// every arithmetic it takes, layout, tile and epilogue; tails in m, n and k (a part of a k tile);
// padded rows; a batch sharing A.
TEST_CASE("mma.sync GEMMs match a double-precision product in every layout, tile and epilogue") {
  const kernels::GemmTarget tgt = kernels::gemm_target(0);
  if (tgt.arch < 80) {
    MESSAGE("the mma.sync kernels need sm_80; this GPU is sm_" << tgt.arch);
    return;
  }
  int runs = 0;
  for (GemmMath math : {GemmMath::bf16, GemmMath::f16, GemmMath::tf32, GemmMath::f32})
    for (int layout = 0; layout < (kernels::tf32_mma(math) ? 1 : 4); ++layout)
      for (GemmEpilogue e : {GemmEpilogue::none, GemmEpilogue::relu_bias}) {
        const bool a_mn = layout & 1, b_mn = layout & 2;
        GemmGeometry g{200, 136, 264, a_mn ? 208 : 272, b_mn ? 136 : 264, 139, math, e, a_mn, b_mn};
        check_launches(g, tgt, 300, runs, kernels::GemmKernel::mma_sync);
      }
  for (GemmMath math : {GemmMath::bf16, GemmMath::tf32}) {
    const bool b_mn = math == GemmMath::bf16;
    GemmGeometry batch{64, 200, 72, 72, b_mn ? 200 : 72, 200, math, GemmEpilogue::bias, false, b_mn, 3, 0, 72 * 200,
                       64 * 200};
    check_launches(batch, tgt, 300, runs, kernels::GemmKernel::mma_sync);
  }
  MESSAGE(runs << " launches checked");
}

// The FFMA kind (f32 sums on the CUDA cores): exact f32 in every layout, epilogue and tile the
// tuner may pick, 16-bit inputs in every layout, k split among blocks, tails in m, n and k,
// padded rows, rows of odd lengths (one element a copy), the mlp's products and a 10-wide
// output. FFMA's f32 sums, in another order than f64's.
TEST_CASE("FFMA GEMMs match a double-precision product in every dtype, layout, tile, split and epilogue") {
  const kernels::GemmTarget tgt = kernels::gemm_target(0);
  std::vector<GemmGeometry> problems;
  for (int layout = 0; layout < 4; ++layout)
    for (GemmEpilogue e : {GemmEpilogue::none, GemmEpilogue::bias, GemmEpilogue::relu_bias}) {
      const bool a_mn = layout & 1, b_mn = layout & 2;
      problems.push_back({200, 136, 264, a_mn ? 208 : 272, b_mn ? 136 : 264, 139, GemmMath::f32, e, a_mn, b_mn});
      problems.push_back({127, 10, 509, a_mn ? 127 : 509, b_mn ? 10 : 509, 10, GemmMath::f32, e, a_mn, b_mn});
    }
  // 16-bit inputs, f32 sums rounded once: rows of 4-element multiples and odd ones.
  for (GemmMath math : {GemmMath::bf16, GemmMath::f16})
    for (int layout = 0; layout < 4; ++layout) {
      const bool a_mn = layout & 1, b_mn = layout & 2;
      problems.push_back(
          {200, 136, 264, a_mn ? 208 : 272, b_mn ? 136 : 264, 139, math, GemmEpilogue::bias, a_mn, b_mn});
      problems.push_back(
          {127, 10, 509, a_mn ? 127 : 509, b_mn ? 10 : 509, 10, math, GemmEpilogue::relu_bias, a_mn, b_mn});
    }
  problems.push_back({128, 512, 784, 784, 784, 512, GemmMath::f32, GemmEpilogue::relu_bias});  // the mlp's forward
  problems.push_back({128, 512, 10, 10, 512, 512, GemmMath::f32, GemmEpilogue::none, false, true});   // its head's dx
  problems.push_back({512, 784, 128, 512, 784, 784, GemmMath::f32, GemmEpilogue::none, true, true});  // a dW
  check_problems(problems, tgt, 500, kernels::GemmKernel::ffma);
  // Launched again, each split product gives the same bits: its tiles' counters were reset.
  const auto l = kernels::plan(kernels::GemmKernel::ffma, problems.back(), tgt, {32, 64, 4});
  REQUIRE(l);
  CHECK(check_launch(*l, 7) == check_launch(*l, 7));
  // On sm_90 a split tile's blocks as one cluster add the same partials in the same order as the
  // parked ones: the same bits, in every dtype, tile and split count a cluster takes.
  if (tgt.arch < 90) return;
  std::vector<kernels::GemmLaunch> pairs;  // parked, then the cluster of the same splits
  for (std::size_t i = 0; i < problems.size(); i += 3)
    for (kernels::GemmTile tile : {kernels::GemmTile{64, 64, 8}, kernels::GemmTile{32, 64, 4},
                                   kernels::GemmTile{64, 16, 3}, kernels::GemmTile{16, 64, 2}}) {
      const auto parked = kernels::plan(kernels::GemmKernel::ffma, problems[i], tgt, tile);
      tile.cluster = true;
      const auto cluster = kernels::plan(kernels::GemmKernel::ffma, problems[i], tgt, tile);
      if (!parked || !cluster || parked->splits != cluster->splits) continue;
      pairs.push_back(*parked);
      pairs.push_back(*cluster);
    }
  prefetch(pairs);
  for (std::size_t p = 0; p < pairs.size(); p += 2) {
    CAPTURE(pairs[p].g.text());
    CAPTURE(pairs[p + 1].text());
    std::vector<std::uint8_t> one, two;
    const auto seed = static_cast<std::uint32_t>(900 + p);
    CHECK(check_launch(pairs[p], seed, false, &one) == check_launch(pairs[p + 1], seed, false, &two));
    CHECK(one == two);
  }
  CHECK(pairs.size() >= 40);
  MESSAGE((pairs.size() / 2) << " cluster launches matched their parked splits bit for bit");
}

// The row kind (a warp per row of D, D of at most 32 columns): every input dtype and epilogue,
// 1, 10 and 32 columns, k of whole 16-byte loads and odd k (one element a load), padded rows and
// the output layers' products of the mlp (512 -> 10) and the cnn (128 -> 10); every block size.
TEST_CASE("row GEMMs match a double-precision product in every dtype, width, epilogue and block size") {
  const kernels::GemmTarget tgt = kernels::gemm_target(0);
  std::vector<GemmGeometry> problems;
  int e = 0;
  for (GemmMath math : {GemmMath::f32, GemmMath::tf32, GemmMath::bf16, GemmMath::f16}) {
    const auto epilogue = [&] { return static_cast<GemmEpilogue>(e++ % 3); };
    problems.push_back({128, 10, 512, 512, 512, 10, math, epilogue()});
    problems.push_back({127, 32, 509, 520, 512, 33, math, epilogue()});
    problems.push_back({300, 1, 784, 784, 784, 1, math, epilogue()});
    problems.push_back({1024, 10, 128, 136, 128, 10, math, epilogue()});
  }
  check_problems(problems, tgt, 900, kernels::GemmKernel::rowdot, 4);
}

TEST_CASE("generated 16-bit GEMMs read MN-major operands and batches of problems") {
  const kernels::GemmTarget tgt = kernels::gemm_target(0);
  if (!on_hopper(tgt)) return;
  int runs = 0;
  for (GemmMath math : {GemmMath::bf16, GemmMath::f16})
    for (bool a_mn : {false, true})
      for (bool b_mn : {false, true}) {
        // Tails in m, n and k; an MN-major operand's rows are m or n long, padded to 8 elements.
        GemmGeometry g{200, 136, 120, 0, 0, 136, math, GemmEpilogue::bias, a_mn, b_mn};
        g.lda = a_mn ? 208 : 120;
        g.ldb = b_mn ? 136 : 120;
        check_launches(g, tgt, 100, runs);
        // Three problems apart, as the images of a 1x1 convolution: D_z (64 x 3136) = W (64 x 256)
        // @ X_z (256 x 3136), X_z MN-major.
        GemmGeometry conv{64, 196, 72, 72, 200, 200, math, GemmEpilogue::none, a_mn, true, 3, 0, 72 * 200, 64 * 200};
        conv.lda = a_mn ? 64 : 72;
        check_launches(conv, tgt, 100, runs);
        // Outputs an odd number of elements apart: every other problem's pairs of columns are
        // unaligned, so they are stored one by one.
        GemmGeometry odd = conv;
        odd.batch_d = 64 * 200 + 1;
        const auto l = kernels::plan(kernels::GemmKernel::wgmma, odd, tgt);
        REQUIRE(l);
        CAPTURE(odd.text());
        CHECK(check_launch(*l, static_cast<std::uint32_t>(100 + runs)) <= tolerance(math));
        ++runs;
      }
  // TF32 and exact f32 read B MN-major into registers (tiles of D^T), one problem and a batch
  // sharing A (a 1x1 convolution's forward); with A MN-major too, shared by the batch (the
  // input gradient's w^T), A is staged K-major first.
  for (GemmMath math : {GemmMath::tf32, GemmMath::f32}) {
    check_launches({200, 136, 120, 120, 136, 136, math, GemmEpilogue::none, false, true}, tgt, 200, runs);
    check_launches({64, 196, 72, 72, 200, 200, math, GemmEpilogue::none, false, true, 3, 0, 72 * 200, 64 * 200}, tgt,
                   200, runs);
    check_launches({70, 196, 40, 70, 200, 200, math, GemmEpilogue::none, true, true, 3, 0, 40 * 200, 70 * 200}, tgt,
                   200, runs);
  }
  MESSAGE(runs << " launches checked");
  // TF32 reads K-major tiles only: an MN-major A is staged K-major where its rows are dense.
  CHECK(kernels::plan(kernels::GemmKernel::wgmma, {64, 64, 64, 64, 64, 64, GemmMath::tf32, GemmEpilogue::none, true},
                      tgt));
  CHECK_FALSE(kernels::plan(kernels::GemmKernel::wgmma,
                            {64, 64, 64, 72, 64, 64, GemmMath::tf32, GemmEpilogue::none, true}, tgt));
}

// In both kinds where they plan (mma.sync: K-major only).
TEST_CASE("exact f32 GEMMs sum all three products of their split operands, exactly") {
  const kernels::GemmTarget tgt = kernels::gemm_target(0);
  if (tgt.arch < 80) return;
  // 128 k tiles in one tile (and split-K), tails and padded rows, B MN-major in registers.
  const GemmGeometry shapes[] = {{1024, 10, 4096, 4096, 4096, 10, GemmMath::f32},
                                 {260, 150, 136, 144, 136, 153, GemmMath::f32},
                                 {64, 196, 72, 72, 200, 200, GemmMath::f32, GemmEpilogue::none, false, true, 3, 0,
                                  72 * 200, 64 * 200}};
  int runs = 0;
  for (const GemmGeometry& g : shapes)
    for (kernels::GemmKernel k : kinds_for(g, tgt))
      for (const kernels::GemmLaunch& l : launches_of(g, tgt, k)) {
        CAPTURE(g.text());
        CAPTURE(l.text());
        CHECK(check_launch(l, static_cast<std::uint32_t>(300 + runs++), true) == 0);
      }
  MESSAGE(runs << " launches checked");
}

// A product whose inputs hold inf and NaN, as FFMA sums it: A (128 x 64) all 0.5 but A[3][7] =
// inf and A[9][20] = NaN, B (64 x 64) all 0.25 but B[5][11] = inf; B K-major, or MN-major (its
// rows in registers). Row 9 is NaN, row 3 and column 5 inf, the rest 64 * 0.125 exactly. In both
// kinds where they plan.
TEST_CASE("exact f32 GEMMs carry inf and NaN through their split operands") {
  const kernels::GemmTarget tgt = kernels::gemm_target(0);
  if (tgt.arch < 80) return;
  for (bool b_mn : {false, true}) {
    CAPTURE(b_mn);
    const GemmGeometry g{128, 64, 64, 64, 64, 64, GemmMath::f32, GemmEpilogue::none, false, b_mn};
    std::vector<float> a(128 * 64, 0.5f), b(64 * 64, 0.25f), d(128 * 64, -1.f);
    a[3 * 64 + 7] = INFINITY;
    a[9 * 64 + 20] = NAN;
    b[b_mn ? 11 * 64 + 5 : 5 * 64 + 11] = INFINITY;
    const rt::Stream& s = rt::default_stream(0);
    rt::DeviceBuffer da(a.size() * 4, s), db(b.size() * 4, s), dd(d.size() * 4, s);
    rt::copy_to_device(da.ptr(), a.data(), a.size() * 4, s);
    rt::copy_to_device(db.ptr(), b.data(), b.size() * 4, s);
    std::vector<kernels::GemmLaunch> launches;
    for (kernels::GemmKernel k : kinds_for(g, tgt))
      for (const kernels::GemmLaunch& l : launches_of(g, tgt, k)) launches.push_back(l);
    for (const kernels::GemmLaunch& l : launches) {
      CAPTURE(l.text());
      kernels::launch(l, {da.ptr(), db.ptr(), dd.ptr(), 0, &s});
      rt::copy_to_host(d.data(), dd.ptr(), d.size() * 4, s);
      s.synchronize();
      int nans = 0, infs = 0, exact = 0;
      for (int i = 0; i < 128; ++i)
        for (int j = 0; j < 64; ++j) {
          const float v = d[static_cast<std::size_t>(i * 64 + j)];
          if (i == 9) nans += std::isnan(v);
          else if (i == 3 || j == 5) infs += std::isinf(v) && v > 0;
          else exact += v == 8.f;
        }
      CHECK(nans == 64);
      CHECK(infs == 64 + 126);
      CHECK(exact == 126 * 63);
    }
  }
}
