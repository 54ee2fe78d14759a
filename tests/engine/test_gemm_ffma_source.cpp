// The GEMM family's FFMA kind (f32 sums on the CUDA cores) compiles with NVRTC for sm_80 and
// sm_90 in every input dtype, tile, layout, epilogue and split (on sm_90 split tiles as clusters
// too), its sums in registers, and its plans size tiles and splits to the SMs and decline what it
// cannot take; runs without a GPU. GPU tests
// check its results.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <string>

#include "backend/cuda/generated/gemm/gemm_plan.h"
#include "gemm_plain_sources.h"

using namespace kiln;
using kernels::GemmEpilogue;
using kernels::GemmGeometry;
using kernels::GemmKernel;
using kernels::GemmMath;
using kernels::GemmTile;
using kiln_test::packed_product;

namespace {

const kernels::GemmTarget kFfmaTarget{90, 132, 227 * 1024};

kernels::GemmEpilogueHook relu_mask_hook(DType t, std::int64_t ld) {
  return {.expr = "mask > 0.f ? acc : 0.f", .inputs = {{"mask", t, kernels::HookIndex::element, ld}}};
}

}  // namespace

TEST_CASE("FFMA GEMM kernels compile for sm_80 and sm_90 in every dtype, tile, layout, epilogue and split") {
  std::vector<kiln_test::CompileJob> jobs;
  auto add = [&](const std::optional<kernels::GemmLaunch>& l, int arch) {
    kiln_test::add_launch_job(jobs, l, GemmKernel::ffma, arch);
  };
  // Rows of multiples of 4 elements (copied 4 at a time) and odd ones (one at a time: by
  // cp.async in f32, by plain loads in 16 bits).
  for (GemmMath math : {GemmMath::f32, GemmMath::bf16, GemmMath::f16})
    for (int layout = 0; layout < 4; ++layout)
      for (GemmTile tile : {GemmTile{64, 64, 1}, GemmTile{32, 64, 4}, GemmTile{64, 16, 8}, GemmTile{16, 64, 2}}) {
        if (math != GemmMath::f32 && tile.bm != 64) continue;
        const GemmEpilogue e = static_cast<GemmEpilogue>((layout + tile.splits) % 3);
        for (auto [m, n, k] : {std::array<std::int64_t, 3>{128, 512, 784}, {127, 10, 509}})
          add(kernels::plan(GemmKernel::ffma, packed_product(m, n, k, math, layout & 1, layout & 2, e), kFfmaTarget,
                            tile),
              90);
      }
  add(kernels::plan(GemmKernel::ffma, packed_product(128, 512, 784, GemmMath::f32), {80, 108, 163 * 1024}), 80);
  // A ReLU's mask as an epilogue hook (an input gradient masked as it is stored), split or not.
  for (GemmMath math : {GemmMath::f32, GemmMath::bf16})
    for (GemmTile tile : {GemmTile{64, 16, 1}, GemmTile{32, 64, 4}}) {
      GemmGeometry g = packed_product(128, 512, 10, math, false, true);
      g.hooks.epilogue = relu_mask_hook(input_dtype(math), 512);
      add(kernels::plan(GemmKernel::ffma, g, kFfmaTarget, tile), 90);
    }
  kiln_test::check_launch_jobs(jobs, GemmKernel::ffma, {"fma.rn.f32", "cp.async"});
}

TEST_CASE("FFMA GEMM kernels whose split tiles are thread-block clusters compile for sm_90") {
  std::vector<kiln_test::CompileJob> jobs;
  for (GemmMath math : {GemmMath::f32, GemmMath::bf16})
    for (GemmTile tile : {GemmTile{64, 64, 8, false, true}, GemmTile{32, 64, 4, false, true},
                          GemmTile{64, 16, 2, false, true}, GemmTile{16, 64, 3, false, true}}) {
      if (math != GemmMath::f32 && tile.bm != 64) continue;
      const GemmEpilogue e = static_cast<GemmEpilogue>(tile.splits % 3);
      for (auto [m, n, k] : {std::array<std::int64_t, 3>{128, 512, 784}, {127, 10, 509}}) {
        const auto l =
            kernels::plan(GemmKernel::ffma, packed_product(m, n, k, math, false, false, e), kFfmaTarget, tile);
        REQUIRE(l);
        CHECK(l->cluster);
        kiln_test::add_launch_job(jobs, l, GemmKernel::ffma, 90);
      }
    }
  // The cluster's shape in the PTX, its partials read from the other blocks' shared memory.
  kiln_test::check_launch_jobs(jobs, GemmKernel::ffma,
                               {".reqnctapercluster", "mapa.shared::cluster", "barrier.cluster"});
}

TEST_CASE("FFMA GEMM plans: tiles and splits fill the SMs (a cluster's twice); the rest is declined") {
  // The mlp's 128 x 784 -> 512 forward: 64-wide tiles, 32 high (16 tiles of 64 fill an eighth
  // of the SMs), k split to fill the SMs twice (8 ways asked: 49 k tiles, 7 a split, so 7).
  const auto fwd =
      kernels::plan(GemmKernel::ffma,
                    packed_product(128, 512, 784, GemmMath::f32, false, false, GemmEpilogue::relu_bias), kFfmaTarget);
  REQUIRE(fwd);
  CHECK((fwd->bm == 32 && fwd->bn == 64 && fwd->splits == 7 && fwd->grid == 224));
  CHECK(fwd->cluster);  // sm_90: a tile's splits are one cluster
  CHECK(fwd->text() == "ffma 32x64 s4 k7 C");
  // Parked (sm_80): the SMs filled once.
  const auto fwd_80 = kernels::plan(GemmKernel::ffma, fwd->g, {80, 108, 163 * 1024});
  REQUIRE(fwd_80);
  CHECK((fwd_80->splits == 3 && !fwd_80->cluster));
  CHECK_FALSE(kernels::split_k(*fwd));  // no second kernel: the blocks of a tile sum
  // Ten columns: tiles 16 wide and 64 high, k split up to 16 ways, two k tiles a split or more;
  // a cluster holds at most 8.
  const auto head = kernels::plan(GemmKernel::ffma, packed_product(128, 10, 512, GemmMath::f32), kFfmaTarget);
  REQUIRE(head);
  CHECK((head->bm == 64 && head->bn == 16 && head->splits == 8 && head->cluster));
  const auto head_80 =
      kernels::plan(GemmKernel::ffma, packed_product(128, 10, 512, GemmMath::f32), {80, 108, 163 * 1024});
  REQUIRE(head_80);
  CHECK((head_80->splits == 16 && !head_80->cluster));
  // Clusters: sm_90, 2 to 8 splits; asked otherwise, declined.
  const GemmGeometry wide = packed_product(128, 512, 784, GemmMath::f32);
  CHECK_FALSE(kernels::plan(GemmKernel::ffma, wide, {80, 108, 163 * 1024}, GemmTile{64, 64, 4, false, true}));
  CHECK_FALSE(kernels::plan(GemmKernel::ffma, wide, kFfmaTarget, GemmTile{64, 64, 12, false, true}));
  CHECK_FALSE(kernels::plan(GemmKernel::ffma, wide, kFfmaTarget, GemmTile{64, 64, 1, false, true}));
  const auto parked = kernels::plan(GemmKernel::ffma, wide, kFfmaTarget, GemmTile{64, 64, 8});
  REQUIRE(parked);
  CHECK_FALSE(parked->cluster);  // the splits' partials parked in global memory, as before sm_90
  const auto shallow =
      kernels::plan(GemmKernel::ffma, packed_product(128, 512, 10, GemmMath::f32, false, true), kFfmaTarget);
  REQUIRE(shallow);
  CHECK(shallow->splits == 1);  // one k tile
  // Every split gets k tiles: 7 asked of 10 k tiles is 5 of 2.
  const auto uneven =
      kernels::plan(GemmKernel::ffma, packed_product(64, 64, 160, GemmMath::f32), kFfmaTarget, GemmTile{64, 64, 7});
  REQUIRE(uneven);
  CHECK(uneven->splits == 5);
  const auto alts = kernels::alternatives(*fwd, kFfmaTarget);
  CHECK_FALSE(alts.empty());
  for (const GemmTile& t : alts) CHECK(kernels::plan(GemmKernel::ffma, fwd->g, kFfmaTarget, t));
  // The heuristic's tile is also timed with its splits parked, and other tiles both ways.
  const auto has = [&](GemmTile want) {
    return std::any_of(alts.begin(), alts.end(), [&](const GemmTile& t) {
      return t.bm == want.bm && t.bn == want.bn && t.splits == want.splits && t.cluster == want.cluster;
    });
  };
  CHECK(has({32, 64, 4, false, false}));
  CHECK(has({32, 64, 4, false, true}));
  CHECK(has({64, 64, 8, false, true}));
  CHECK(has({64, 64, 8, false, false}));
  // f32, bf16 or f16 inputs (not TF32's), one plain problem, no hooks; tiles of whole warps up
  // to 64 x 64.
  CHECK(kernels::plan(GemmKernel::ffma, packed_product(128, 10, 512, GemmMath::bf16, false, false, GemmEpilogue::bias),
                      kFfmaTarget));
  CHECK_FALSE(kernels::plan(
      GemmKernel::ffma, packed_product(128, 10, 512, GemmMath::tf32, false, false, GemmEpilogue::bias), kFfmaTarget));
  GemmGeometry batched = packed_product(128, 512, 784, GemmMath::f32);
  batched.batch = 2, batched.batch_a = 128 * 784, batched.batch_b = 0, batched.batch_d = 128 * 512;
  CHECK_FALSE(kernels::plan(GemmKernel::ffma, batched, kFfmaTarget));
  // Epilogue hooks that are pointwise expressions; not statistics, accumulation, another
  // output dtype or a prologue.
  GemmGeometry hooked = packed_product(128, 512, 784, GemmMath::f32);
  hooked.hooks.epilogue = relu_mask_hook(DType::f32, 512);
  const auto masked = kernels::plan(GemmKernel::ffma, hooked, kFfmaTarget);
  REQUIRE(masked);
  CHECK(kernels::operands_fit(*masked, {4096, 8192, 12288, 0, nullptr, {20480}}));
  CHECK_FALSE(kernels::operands_fit(*masked, {4096, 8192, 12288, 0}));  // the mask not given
  CHECK_FALSE(kernels::operands_fit(*masked, {4096, 8192, 12288, 0, nullptr, {20482}}));
  CHECK(masked->g.text().find(" hooks:") != std::string::npos);  // a tuning problem of its own
  for (auto change : {+[](kernels::GemmEpilogueHook& e) { e.stats = kernels::HookStats::columns; },
                      +[](kernels::GemmEpilogueHook& e) { e.accumulate = true; },
                      +[](kernels::GemmEpilogueHook& e) { e.out = DType::bf16; }}) {
    GemmGeometry g = hooked;
    change(*g.hooks.epilogue);
    CHECK_FALSE(kernels::plan(GemmKernel::ffma, g, kFfmaTarget));
  }
  GemmGeometry prologued = packed_product(128, 512, 784, GemmMath::f32);
  prologued.hooks.prologue = kernels::GemmPrologueHook{"a * 2.0f"};
  CHECK_FALSE(kernels::plan(GemmKernel::ffma, prologued, kFfmaTarget));
  CHECK_FALSE(
      kernels::plan(GemmKernel::ffma, packed_product(128, 512, 784, GemmMath::f32), kFfmaTarget, GemmTile{16, 16}));
  CHECK_FALSE(
      kernels::plan(GemmKernel::ffma, packed_product(128, 512, 784, GemmMath::f32), kFfmaTarget, GemmTile{128, 64}));
  // Operands: 16-byte bases where rows are copied 16 bytes at a time, 4-byte ones elsewhere.
  kernels::GemmOperands ops{4096, 8192, 12288, 16384};
  CHECK(kernels::operands_fit(*fwd, ops));
  ops.a += 4;
  CHECK_FALSE(kernels::operands_fit(*fwd, ops));
  const auto odd = kernels::plan(GemmKernel::ffma, packed_product(127, 10, 509, GemmMath::f32), kFfmaTarget);
  REQUIRE(odd);
  CHECK(kernels::operands_fit(*odd, {4100, 8196, 12292, 0}));
  CHECK_FALSE(kernels::operands_fit(*odd, {4100, 8194, 12292, 0}));
  // 16-bit: 8-byte bases for rows copied 4 elements at a time, 2-byte ones for odd rows.
  const auto half = kernels::plan(
      GemmKernel::ffma, packed_product(128, 512, 784, GemmMath::bf16, false, false, GemmEpilogue::none), kFfmaTarget);
  REQUIRE(half);
  CHECK(kernels::operands_fit(*half, {4104, 8200, 12290, 0}));
  CHECK_FALSE(kernels::operands_fit(*half, {4100, 8200, 12290, 0}));
  const auto odd_half = kernels::plan(
      GemmKernel::ffma, packed_product(127, 10, 509, GemmMath::f16, false, false, GemmEpilogue::bias), kFfmaTarget);
  REQUIRE(odd_half);
  CHECK(kernels::operands_fit(*odd_half, {4098, 8194, 12290, 16386}));
  CHECK_FALSE(kernels::operands_fit(*odd_half, {4098, 8194, 12290, 16385}));
}
