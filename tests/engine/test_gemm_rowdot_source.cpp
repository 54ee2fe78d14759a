// The GEMM family's row kind (a warp per row of D, for D of at most 32 columns) compiles with
// NVRTC for sm_80 and sm_90 in every input dtype, width, epilogue and load width, its sums in
// registers, and its plans size blocks to the SMs and decline what it cannot take; runs without a
// GPU. GPU tests check its results.
#include <doctest/doctest.h>

#include <array>
#include <string>
#include <utility>

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

const kernels::GemmTarget kTarget{90, 132, 227 * 1024};

}  // namespace

TEST_CASE("row GEMM kernels compile for sm_80 and sm_90 in every dtype, width, epilogue and load width") {
  std::vector<kiln_test::CompileJob> jobs;
  auto add = [&](const std::optional<kernels::GemmLaunch>& l, int arch) {
    kiln_test::add_launch_job(jobs, l, GemmKernel::rowdot, arch);
  };
  int e = 0;
  for (GemmMath math : {GemmMath::f32, GemmMath::tf32, GemmMath::bf16, GemmMath::f16})
    // 16-byte loads (k of whole vectors) and one element at a time (k = 509); 1, 10 and 32 columns.
    for (auto [m, n, k] : {std::array<std::int64_t, 3>{128, 10, 512}, {127, 32, 784}, {1024, 1, 509}})
      add(kernels::plan(GemmKernel::rowdot, packed_product(m, n, k, math, false, false, GemmEpilogue(e++ % 3)),
                        kTarget),
          90);
  add(kernels::plan(GemmKernel::rowdot, packed_product(128, 10, 128, GemmMath::bf16, false, false, GemmEpilogue::bias),
                    {80, 108, 163 * 1024}),
      80);
  kiln_test::check_launch_jobs(jobs, GemmKernel::rowdot, {"fma.rn.f32", "shfl.sync.bfly"});
}

TEST_CASE("row GEMM plans: a warp a row, blocks that fill the SMs; the rest is declined") {
  // The mlp's output layer at batch 128: 128 rows, a warp a block (two or four would leave over
  // half of 132 SMs without a block).
  const auto head = kernels::plan(
      GemmKernel::rowdot, packed_product(128, 10, 512, GemmMath::f32, false, false, GemmEpilogue::bias), kTarget);
  REQUIRE(head);
  CHECK((head->bm == 1 && head->bn == 10 && head->grid == 128));
  CHECK(head->text() == "rowdot 1x10 s1");
  CHECK_FALSE(kernels::split_k(*head));
  // At batch 1024: four warps a block, 256 blocks.
  const auto wide = kernels::plan(GemmKernel::rowdot, packed_product(1024, 10, 512, GemmMath::bf16), kTarget);
  REQUIRE(wide);
  CHECK((wide->bm == 4 && wide->grid == 256));
  const auto alts = kernels::alternatives(*head, kTarget);
  CHECK(alts.size() == 3);
  for (const GemmTile& t : alts) {
    const auto l = kernels::plan(GemmKernel::rowdot, head->g, kTarget, t);
    REQUIRE(l);
    CHECK(l->bm == t.bm);
    CHECK(l->grid == (128 + t.bm - 1) / t.bm);
  }
  // Up to 32 columns, both operands K-major, one plain problem, no hooks, no split k.
  CHECK(kernels::plan(GemmKernel::rowdot, packed_product(64, 32, 100, GemmMath::f16), kTarget));
  CHECK_FALSE(kernels::plan(GemmKernel::rowdot, packed_product(64, 33, 100, GemmMath::f32), kTarget));
  CHECK_FALSE(kernels::plan(GemmKernel::rowdot, packed_product(64, 10, 100, GemmMath::f32, true, false), kTarget));
  CHECK_FALSE(kernels::plan(GemmKernel::rowdot, packed_product(64, 10, 100, GemmMath::f32, false, true), kTarget));
  CHECK_FALSE(
      kernels::plan(GemmKernel::rowdot, packed_product(64, 10, 100, GemmMath::f32), kTarget, GemmTile{4, 10, 2}));
  CHECK_FALSE(kernels::plan(GemmKernel::rowdot, packed_product(64, 10, 100, GemmMath::f32), kTarget, GemmTile{3, 10}));
  GemmGeometry batched = packed_product(64, 10, 100, GemmMath::f32);
  batched.batch = 2, batched.batch_a = 6400, batched.batch_b = 0, batched.batch_d = 640;
  CHECK_FALSE(kernels::plan(GemmKernel::rowdot, batched, kTarget));
  GemmGeometry hooked = packed_product(64, 10, 100, GemmMath::f32);
  hooked.hooks.prologue = kernels::GemmPrologueHook{"a * 2.0f"};
  CHECK_FALSE(kernels::plan(GemmKernel::rowdot, hooked, kTarget));
  GemmGeometry short_rows = packed_product(64, 10, 100, GemmMath::f32);
  short_rows.lda = 99;
  CHECK_FALSE(kernels::plan(GemmKernel::rowdot, short_rows, kTarget));
  // Operands: 16-byte bases where a lane loads 16 bytes (k and both strides multiples of 4 f32s),
  // the dtype's alignment elsewhere, and the bias given with a built-in epilogue.
  CHECK(kernels::operands_fit(*head, {4096, 8192, 12292, 16388}));
  CHECK_FALSE(kernels::operands_fit(*head, {4100, 8192, 12292, 16388}));
  CHECK_FALSE(kernels::operands_fit(*head, {4096, 8192, 12292, 0}));
  const auto odd = kernels::plan(GemmKernel::rowdot, packed_product(64, 10, 509, GemmMath::f32), kTarget);
  REQUIRE(odd);
  CHECK(kernels::operands_fit(*odd, {4100, 8196, 12292, 0}));
  CHECK_FALSE(kernels::operands_fit(*odd, {4102, 8196, 12292, 0}));
}

// The product and the softmax cross-entropy of its rows in one kernel: softmax.cu's rows after
// the row template, for each logits dtype and its loss's (the logits' own, or f32 for 16 bits).
TEST_CASE("the row kind's fused cross-entropy compiles for every logits and loss dtype") {
  std::vector<kiln_test::CompileJob> jobs;
  const std::pair<GemmMath, DType> cases[] = {{GemmMath::f32, DType::f32},   {GemmMath::tf32, DType::f32},
                                              {GemmMath::bf16, DType::bf16}, {GemmMath::bf16, DType::f32},
                                              {GemmMath::f16, DType::f16},   {GemmMath::f16, DType::f32}};
  for (auto [math, loss] : cases) {
    const auto l = kernels::plan(GemmKernel::rowdot,
                                 packed_product(128, 10, 512, math, false, false, GemmEpilogue::bias), kTarget);
    REQUIRE(l);
    CHECK(kernels::rowdot_cross_entropy_fits(*l));
    const std::string src = kernels::rowdot_cross_entropy_source(*l, loss);
    CHECK(rt::template_placeholders(src).empty());
    jobs.push_back(kiln_test::generated_job("check_rowdot_ce", src, "kiln_gemm_rowdot_cross_entropy", 90));
  }
  const kiln_test::CompileSummary r = kiln_test::compile_all(jobs);
  MESSAGE("rowdot cross-entropy: " << r.text());
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    CAPTURE(i);
    const kiln_test::CompileOutcome& o = r.outcomes[i];
    CHECK_MESSAGE(o.error.empty(), o.error);
    CHECK(o.ptx.find("kiln_gemm_rowdot_cross_entropy") != std::string::npos);
    CHECK(o.ptx.find("kiln_softmax_cross_entropy") == std::string::npos);         // softmax.cu's rows only
    CHECK(o.ptx.find("kiln_kernels_wait_for_prior_grids") != std::string::npos);  // stated once
  }
  // Rows of n (dense logits) and no ReLU; another kind, padded rows or a ReLU do not fit.
  const auto relu = kernels::plan(
      GemmKernel::rowdot, packed_product(128, 10, 512, GemmMath::f32, false, false, GemmEpilogue::relu_bias), kTarget);
  REQUIRE(relu);
  CHECK_FALSE(kernels::rowdot_cross_entropy_fits(*relu));
  GemmGeometry padded = packed_product(128, 10, 512, GemmMath::f32);
  padded.ldd = 12;
  const auto wide = kernels::plan(GemmKernel::rowdot, padded, kTarget);
  REQUIRE(wide);
  CHECK_FALSE(kernels::rowdot_cross_entropy_fits(*wide));
  const auto ffma = kernels::plan(GemmKernel::ffma, packed_product(128, 10, 512, GemmMath::f32), kTarget);
  REQUIRE(ffma);
  CHECK_FALSE(kernels::rowdot_cross_entropy_fits(*ffma));
}

// A row-kind product's input gradient masked for the ReLU that made A: its own module (no product
// kernel in it) for f32, bf16 and f16, 16-byte loads and one element at a time; none for f64 or
// more than 32 columns.
TEST_CASE("the row kind's masked input gradient compiles in every dtype and load width") {
  std::vector<kiln_test::CompileJob> jobs;
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    for (auto [m, n, k] : {std::array<std::int64_t, 3>{256, 10, 256}, {33, 32, 509}}) {
      const auto l = kernels::plan_rowdot_input_grad(t, m, n, k, kTarget);
      REQUIRE(l);
      CHECK(l->g.m == m);
      CHECK(l->bn == n);
      const std::string src = kernels::rowdot_input_grad_source(*l);
      CHECK(rt::template_placeholders(src).empty());
      jobs.push_back(kiln_test::generated_job("check_rowdot_input_grad", src, "kiln_gemm_rowdot_input_grad", 90));
    }
  const kiln_test::CompileSummary r = kiln_test::compile_all(jobs);
  MESSAGE("rowdot input gradient: " << r.text());
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    CAPTURE(i);
    const kiln_test::CompileOutcome& o = r.outcomes[i];
    CHECK_MESSAGE(o.error.empty(), o.error);
    CHECK(o.ptx.find("kiln_gemm_rowdot_input_grad") != std::string::npos);
    CHECK(o.ptx.find(".entry kiln_gemm_rowdot(") == std::string::npos);
    CHECK(o.ptx.find("fma.rn.f32") != std::string::npos);
  }
  // The fused loss takes it where a lane's one slice covers k: 32 loads of 16 bytes, or 32 elements.
  auto one_slice = [](GemmMath math, std::int64_t k) {
    const auto l = kernels::plan(GemmKernel::rowdot, packed_product(128, 10, k, math), kTarget);
    REQUIRE(l);
    return kernels::rowdot_masked_dx_in_one_slice(*l);
  };
  CHECK(one_slice(GemmMath::bf16, 256));  // the speedrun's output layer
  CHECK_FALSE(one_slice(GemmMath::bf16, 512));
  CHECK(one_slice(GemmMath::f32, 128));
  CHECK_FALSE(one_slice(GemmMath::f32, 512));  // the mlp's
  CHECK(one_slice(GemmMath::f32, 31));
  CHECK_FALSE(one_slice(GemmMath::f32, 33));
  CHECK_FALSE(kernels::plan_rowdot_input_grad(DType::f64, 64, 10, 100, kTarget));
  CHECK_FALSE(kernels::plan_rowdot_input_grad(DType::f32, 64, 33, 100, kTarget));
  CHECK_FALSE(kernels::plan_rowdot_input_grad(DType::f32, 0, 10, 100, kTarget));
}
