// The GEMM tile engine's hooks (backend/cuda/generated/gemm/gemm_hooks.h) without a GPU: every
// prologue and epilogue variant compiles for sm_90a, malformed hooks are ValueErrors that say
// what is wrong, and the statistics' partials have the documented shape. GPU tests check results.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "backend/cuda/generated/gemm/gemm_plan.h"
#include "compile_check.h"
#include "kiln/error.h"

using namespace kiln;
using kernels::GemmEpilogueHook;
using kernels::GemmGeometry;
using kernels::GemmKernel;
using kernels::GemmMath;
using kernels::GemmPrologueHook;
using kernels::GemmTile;
using kernels::HookIndex;
using kernels::HookInput;
using kernels::HookStats;

namespace {

const kernels::GemmTarget kHopperHooks{90, 132, 227 * 1024};

GemmPrologueHook scale_shift_relu() {
  return {"kiln::math::relu(a * scale + shift)", {{"scale", DType::f32}, {"shift", DType::f32}}, {}};
}

// Every kind of input: a row vector, a column vector, a matrix, and a param.
GemmEpilogueHook residual_epilogue(DType out, std::int64_t ld) {
  GemmEpilogueHook e;
  e.expr = "kiln::math::gelu(acc * C(p0) + bias) + res * rs";
  e.inputs = {{"bias", DType::bf16, HookIndex::column}, {"rs", DType::f32, HookIndex::row},
              {"res", DType::f16, HookIndex::element, ld}};
  e.params = {0.5};
  e.out = out;
  return e;
}

GemmEpilogueHook stats_epilogue(HookStats s) {
  GemmEpilogueHook e;
  e.stats = s;
  return e;
}

std::string plan_error(const GemmGeometry& g) {
  try {
    (void)kernels::plan(GemmKernel::wgmma, g, kHopperHooks);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("GEMM hooks: every prologue and epilogue variant compiles for sm_90a") {
  struct Case {
    GemmGeometry g;
    GemmTile tile;
    const char* must;  // PTX the variant must contain
  };
  std::vector<Case> cases;
  for (GemmMath math : {GemmMath::bf16, GemmMath::tf32})
    for (bool a_mn : {false, true}) {
      if (math == GemmMath::tf32 && a_mn) continue;
      GemmGeometry g{320, 200, 136, a_mn ? 320 : 136, 136, 200, math, kernels::GemmEpilogue::none, a_mn};
      g.hooks.prologue = scale_shift_relu();
      cases.push_back({g, {}, "fence.proxy.async"});
    }
  for (DType out : {DType::f32, DType::bf16}) {
    GemmGeometry g{300, 200, 136, 136, 136, 200, GemmMath::bf16};
    g.hooks.epilogue = residual_epilogue(out, 208);
    cases.push_back({g, {}, "wgmma.mma_async"});
  }
  GemmGeometry acc{300, 200, 136, 136, 136, 200, GemmMath::tf32};
  acc.hooks.epilogue = GemmEpilogueHook{};
  acc.hooks.epilogue->accumulate = true;
  cases.push_back({acc, {}, "wgmma.mma_async"});
  for (HookStats s : {HookStats::rows, HookStats::columns})
    for (GemmTile tile : {GemmTile{128, 256}, GemmTile{64, 128}}) {
      GemmGeometry g{1000, 300, 520, 520, 520, 300, GemmMath::bf16};
      g.hooks.epilogue = stats_epilogue(s);
      g.hooks.prologue = scale_shift_relu();
      cases.push_back({g, tile, s == HookStats::columns ? "bar.sync" : "shfl.sync.bfly"});
    }
  // Channels that one tile spans (a CTA's sums in registers): 100 rows, 200 columns.
  for (HookStats s : {HookStats::rows, HookStats::columns}) {
    GemmGeometry g{s == HookStats::rows ? 100 : 1000,
                   s == HookStats::rows ? 1000 : 200,
                   64,
                   64,
                   64,
                   s == HookStats::rows ? 1000 : 200,
                   GemmMath::bf16};
    g.hooks.epilogue = stats_epilogue(s);
    cases.push_back({g, GemmTile{128, s == HookStats::rows ? 128 : 256}, "shfl.sync.bfly"});
  }
  // Convolution mode's tiles of D^T (32 and 40 channels, bf16 and TF32): D's row statistics as
  // their columns' sums.
  for (std::int64_t m : {32, 40}) {
    const kernels::GemmConv c{24, 12, 12, 3, 3, 0, 0, false};
    GemmGeometry g{
        m, c.oh() * c.ow(), c.r * c.s * c.c, 0, 0, c.oh() * c.ow(), m == 40 ? GemmMath::tf32 : GemmMath::bf16};
    g.conv = c;
    g.batch = 8, g.batch_b = c.c * c.h * c.w, g.batch_d = m * c.oh() * c.ow();
    g.hooks.epilogue = stats_epilogue(HookStats::rows);
    cases.push_back({g, m == 32 ? GemmTile{} : GemmTile{64, 0, 0, true}, "bar.sync"});
  }
  std::vector<kiln_test::CompileJob> jobs;
  for (const Case& c : cases) {
    CAPTURE(c.g.text());
    const auto l = kernels::plan(GemmKernel::wgmma, c.g, kHopperHooks, c.tile);
    REQUIRE(l);
    CHECK(l->shared_bytes <= kHopperHooks.max_shared);
    jobs.push_back(kiln_test::generated_job("check_gemm_hooks", kernels::source(*l), "kiln_gemm_wgmma", 90));
  }
  const kiln_test::CompileSummary r = kiln_test::compile_all(jobs);
  MESSAGE("gemm hooks: " << r.text());
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    CAPTURE(cases[i].g.text());
    const kiln_test::CompileOutcome& o = r.outcomes[i];
    CHECK_MESSAGE(o.error.empty(), o.error);
    CHECK(o.ptx.find(cases[i].must) != std::string::npos);
    CHECK(o.ptx.find("__local_depot") == std::string::npos);  // accumulators stay in registers
  }
}

TEST_CASE("GEMM hooks: malformed descriptions are ValueErrors naming what is wrong") {
  const GemmGeometry base{128, 64, 64, 64, 64, 64, GemmMath::bf16};
  auto with_epilogue = [&](GemmEpilogueHook e) {
    GemmGeometry g = base;
    g.hooks.epilogue = std::move(e);
    return g;
  };
  GemmEpilogueHook named_acc{"acc + acc", {{"acc", DType::f32}}};
  CHECK(plan_error(with_epilogue(named_acc)).find("'acc': not a free C identifier") != std::string::npos);
  GemmEpilogueHook twice{"acc + b", {{"b", DType::f32}, {"b", DType::f32}}};
  CHECK(plan_error(with_epilogue(twice)).find("named twice") != std::string::npos);
  GemmEpilogueHook integer{"acc + b", {{"b", DType::i32}}};
  CHECK(plan_error(with_epilogue(integer)).find("dtype must be f32, bf16 or f16") != std::string::npos);
  GemmEpilogueHook statement{"acc; return 0", {}};
  CHECK(plan_error(with_epilogue(statement)).find("not a plain expression") != std::string::npos);
  GemmEpilogueHook nan_param{"acc * C(p0)", {}, {std::nan("")}};
  CHECK(plan_error(with_epilogue(nan_param)).find("params must be finite") != std::string::npos);
  GemmEpilogueHook both;
  both.accumulate = true, both.stats = HookStats::rows;
  CHECK(plan_error(with_epilogue(both)).find("cannot accumulate and take statistics") != std::string::npos);
  GemmEpilogueHook short_rows{"acc + r", {{"r", DType::f32, HookIndex::element, 32}}};
  CHECK(plan_error(with_epilogue(short_rows)).find("row stride 32 is shorter than a row of 64") != std::string::npos);
  GemmGeometry builtin = with_epilogue(GemmEpilogueHook{});
  builtin.epilogue = kernels::GemmEpilogue::bias;
  CHECK(plan_error(builtin).find("cannot both be given") != std::string::npos);
  GemmGeometry per_row = base;
  per_row.hooks.prologue = GemmPrologueHook{"a * s", {{"s", DType::f32, HookIndex::row}}};
  CHECK(plan_error(per_row).find("one value per k") != std::string::npos);
  GemmGeometry no_expr = base;
  no_expr.hooks.prologue = GemmPrologueHook{};
  CHECK(plan_error(no_expr).find("prologue expression") != std::string::npos);
}

TEST_CASE("GEMM hooks: operands, statistics' shape and the key") {
  GemmGeometry g{1000, 300, 64, 64, 64, 300, GemmMath::bf16};
  g.hooks.epilogue = GemmEpilogueHook{"acc + b", {{"b", DType::f32, HookIndex::column}}};
  g.hooks.epilogue->stats = HookStats::columns;
  const auto l = kernels::plan(GemmKernel::wgmma, g, kHopperHooks, GemmTile{128, 128});
  REQUIRE(l);
  CHECK(kernels::stats_shape(*l).parts == 8 * 2);  // 8 tiles of 128 rows, 2 consumers each
  CHECK(kernels::stats_shape(*l).channels == 300);
  kernels::GemmOperands ops{0x1000, 0x2000, 0x3000, 0, nullptr};
  CHECK_FALSE(kernels::operands_fit(*l, ops));  // no input, no statistics
  ops.epilogue_inputs[0] = 0x4000;
  CHECK_FALSE(kernels::operands_fit(*l, ops));
  ops.stats = 0x5000;
  CHECK(kernels::operands_fit(*l, ops));
  ops.epilogue_inputs[0] = 0x4002;  // an f32 input must be 4-byte aligned
  CHECK_FALSE(kernels::operands_fit(*l, ops));

  g.hooks.epilogue->stats = HookStats::rows;
  const auto rows = kernels::plan(GemmKernel::wgmma, g, kHopperHooks, GemmTile{128, 128});
  REQUIRE(rows);
  CHECK(kernels::stats_shape(*rows).parts == 3);  // 3 tiles of 128 columns
  CHECK(kernels::stats_shape(*rows).channels == 1000);
  // Rows that one tile spans: a part per CTA (8 tiles of 128 columns, 100 rows in one of 128).
  GemmGeometry narrow{100, 1000, 64, 64, 64, 1000, GemmMath::bf16};
  narrow.hooks.epilogue = stats_epilogue(HookStats::rows);
  const auto per_cta = kernels::plan(GemmKernel::wgmma, narrow, kHopperHooks, GemmTile{128, 128});
  REQUIRE(per_cta);
  CHECK(kernels::stats_shape(*per_cta).parts == per_cta->grid);
  CHECK(per_cta->grid == 8);
  // Convolution mode with 32 channels tiles D^T, statistics and all; one tile spans the channels,
  // so a part per CTA and consumer (256 images of 10 x 10 pixels: a box of 128 rows each, two
  // consumers, on 132 CTAs).
  const kernels::GemmConv cv{24, 12, 12, 3, 3, 0, 0, false};
  GemmGeometry conv{32, cv.oh() * cv.ow(), cv.r * cv.s * cv.c, 0, 0, cv.oh() * cv.ow(), GemmMath::bf16};
  conv.conv = cv;
  conv.batch = 256, conv.batch_b = cv.c * cv.h * cv.w, conv.batch_d = 32 * cv.oh() * cv.ow();
  conv.hooks.epilogue = stats_epilogue(HookStats::rows);
  const auto transposed = kernels::plan(GemmKernel::wgmma, conv, kHopperHooks);
  REQUIRE(transposed);
  CHECK(transposed->transposed);
  CHECK(kernels::stats_shape(*transposed).channels == 32);
  CHECK(transposed->grid == 132);
  CHECK(kernels::stats_shape(*transposed).parts == 132 * (transposed->bm / 64));
  // Any other hook keeps D's rows as rows.
  conv.hooks.epilogue->expr = "acc * C(2)";
  const auto plain_rows = kernels::plan(GemmKernel::wgmma, conv, kHopperHooks);
  REQUIRE(plain_rows);
  CHECK_FALSE(plain_rows->transposed);
  // Hooks are part of the problem: different hooks, different text.
  CHECK(rows->g.text() != l->g.text());
  CHECK(rows->g.text().find(" hooks:") != std::string::npos);
  CHECK(kernels::output_dtype(g) == DType::bf16);
  g.hooks.epilogue->out = DType::f32;
  CHECK(kernels::output_dtype(g) == DType::f32);
}
