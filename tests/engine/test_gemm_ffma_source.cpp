// The GEMM family's FFMA kind (exact f32 on the CUDA cores) compiles with NVRTC for sm_80 and
// sm_90 in every tile, layout, epilogue and split, its sums in registers, and its plans size
// tiles and splits to the SMs and decline what it cannot take; runs without a GPU. GPU tests
// check its results.
#include <doctest/doctest.h>

#include <string>

#include "backend/cuda/generated/gemm/gemm_plan.h"
#include "compile_check.h"
#include "kiln/runtime/templates.h"

using namespace kiln;
using kernels::GemmEpilogue;
using kernels::GemmGeometry;
using kernels::GemmKernel;
using kernels::GemmMath;
using kernels::GemmTile;

namespace {

const kernels::GemmTarget kFfmaTarget{90, 132, 227 * 1024};

// m x n x k with A and B K-major (or MN-major), packed.
GemmGeometry ffma_product(std::int64_t m, std::int64_t n, std::int64_t k, bool a_mn = false, bool b_mn = false,
                          GemmEpilogue e = GemmEpilogue::none) {
  GemmGeometry g{m, n, k, a_mn ? m : k, b_mn ? n : k, n, GemmMath::f32, e};
  g.a_mn = a_mn, g.b_mn = b_mn;
  return g;
}

}  // namespace

TEST_CASE("FFMA GEMM kernels compile for sm_80 and sm_90 in every tile, layout, epilogue and split") {
  std::vector<kiln_test::CompileJob> jobs;
  auto add = [&](const std::optional<kernels::GemmLaunch>& l, int arch) {
    REQUIRE(l);
    CHECK(l->kernel == GemmKernel::ffma);
    const std::string src = kernels::source(*l);
    CHECK(rt::template_placeholders(src).empty());
    jobs.push_back(kiln_test::generated_job("check_gemm_ffma", src, "kiln_gemm_ffma", arch));
  };
  // 4-float rows (16-byte loads) and odd ones (one float a load).
  for (int layout = 0; layout < 4; ++layout)
    for (GemmTile tile : {GemmTile{64, 64, 1}, GemmTile{32, 64, 4}, GemmTile{64, 16, 8}, GemmTile{16, 64, 2}}) {
      const GemmEpilogue e = static_cast<GemmEpilogue>((layout + tile.splits) % 3);
      add(kernels::plan(GemmKernel::ffma, ffma_product(128, 512, 784, layout & 1, layout & 2, e), kFfmaTarget, tile),
          90);
      add(kernels::plan(GemmKernel::ffma, ffma_product(127, 10, 509, layout & 1, layout & 2, e), kFfmaTarget, tile),
          90);
    }
  add(kernels::plan(GemmKernel::ffma, ffma_product(128, 512, 784), {80, 108, 163 * 1024}), 80);
  const kiln_test::CompileSummary r = kiln_test::compile_all(jobs);
  MESSAGE("gemm_ffma: " << r.text());
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    CAPTURE(i);
    const kiln_test::CompileOutcome& o = r.outcomes[i];
    CHECK_MESSAGE(o.error.empty(), o.error);
    CHECK(o.cubin.size() > 0);
    for (const char* needle : {"fma.rn.f32", "cp.async", "kiln_gemm_ffma"})
      CHECK(o.ptx.find(needle) != std::string::npos);
    CHECK(o.ptx.find("__local_depot") == std::string::npos);  // the sums stay in registers
  }
}

TEST_CASE("FFMA GEMM plans: tiles and splits fill the SMs once; the rest is declined") {
  // The mlp's 128 x 784 -> 512 forward: 64-wide tiles, 32 high (16 tiles of 64 fill an eighth
  // of the SMs), k split 4 ways (49 k tiles, 13 a split).
  const auto fwd =
      kernels::plan(GemmKernel::ffma, ffma_product(128, 512, 784, false, false, GemmEpilogue::relu_bias), kFfmaTarget);
  REQUIRE(fwd);
  CHECK((fwd->bm == 32 && fwd->bn == 64 && fwd->splits == 4 && fwd->grid == 128));
  CHECK(fwd->text() == "ffma 32x64 s4 k4");
  CHECK_FALSE(kernels::split_k(*fwd));  // no second kernel: the last block of a tile sums
  // Ten columns: tiles 16 wide and 64 high, k split up to 16 ways, two k tiles a split or more.
  const auto head = kernels::plan(GemmKernel::ffma, ffma_product(128, 10, 512), kFfmaTarget);
  REQUIRE(head);
  CHECK((head->bm == 64 && head->bn == 16 && head->splits == 16));
  const auto shallow = kernels::plan(GemmKernel::ffma, ffma_product(128, 512, 10, false, true), kFfmaTarget);
  REQUIRE(shallow);
  CHECK(shallow->splits == 1);  // one k tile
  // Every split gets k tiles: 7 asked of 10 k tiles is 5 of 2.
  const auto uneven = kernels::plan(GemmKernel::ffma, ffma_product(64, 64, 160), kFfmaTarget, GemmTile{64, 64, 7});
  REQUIRE(uneven);
  CHECK(uneven->splits == 5);
  const auto alts = kernels::alternatives(*fwd, kFfmaTarget);
  CHECK_FALSE(alts.empty());
  for (const GemmTile& t : alts) CHECK(kernels::plan(GemmKernel::ffma, fwd->g, kFfmaTarget, t));
  // Exact f32 only, one plain problem, no hooks; tiles of whole warps up to 64 x 64.
  GemmGeometry bf16 = ffma_product(128, 512, 784);
  bf16.math = GemmMath::bf16;
  CHECK_FALSE(kernels::plan(GemmKernel::ffma, bf16, kFfmaTarget));
  GemmGeometry batched = ffma_product(128, 512, 784);
  batched.batch = 2, batched.batch_a = 128 * 784, batched.batch_b = 0, batched.batch_d = 128 * 512;
  CHECK_FALSE(kernels::plan(GemmKernel::ffma, batched, kFfmaTarget));
  GemmGeometry hooked = ffma_product(128, 512, 784);
  hooked.hooks.epilogue = kernels::GemmEpilogueHook{"acc * 2.0f"};
  CHECK_FALSE(kernels::plan(GemmKernel::ffma, hooked, kFfmaTarget));
  CHECK_FALSE(kernels::plan(GemmKernel::ffma, ffma_product(128, 512, 784), kFfmaTarget, GemmTile{16, 16}));
  CHECK_FALSE(kernels::plan(GemmKernel::ffma, ffma_product(128, 512, 784), kFfmaTarget, GemmTile{128, 64}));
  // Operands: 16-byte bases where rows are copied 16 bytes at a time, 4-byte ones elsewhere.
  kernels::GemmOperands ops{4096, 8192, 12288, 16384};
  CHECK(kernels::operands_fit(*fwd, ops));
  ops.a += 4;
  CHECK_FALSE(kernels::operands_fit(*fwd, ops));
  const auto odd = kernels::plan(GemmKernel::ffma, ffma_product(127, 10, 509), kFfmaTarget);
  REQUIRE(odd);
  CHECK(kernels::operands_fit(*odd, {4100, 8196, 12292, 0}));
  CHECK_FALSE(kernels::operands_fit(*odd, {4100, 8194, 12292, 0}));
}
