// The GEMM tile engine's staged stores (the epilogue's 16-byte pieces of D's rows through shared
// memory): which launches take them, what they cost in shared memory, and that every variant
// compiles for sm_90a with its accumulators in registers. Runs without a GPU; the GPU suites
// (the 1x1 convolutions, short products) check their results.
#include <doctest/doctest.h>

#include <string>

#include "backend/cuda/generated/gemm/gemm_internal.h"
#include "compile_check.h"

using namespace kiln;
using kernels::GemmGeometry;
using kernels::GemmKernel;
using kernels::GemmLaunch;
using kernels::GemmMath;
using kernels::GemmTile;

namespace {

const kernels::GemmTarget kStagedTarget{90, 132, 227 * 1024};

GemmLaunch staged_plan(const GemmGeometry& g, GemmTile tile = {}) {
  const auto l = kernels::plan(GemmKernel::wgmma, g, kStagedTarget, tile);
  REQUIRE(l);
  return *l;
}

// A stride-1 convolution's forward (or, with `wgrad`, weight gradient) over `n` images.
GemmGeometry staged_conv(std::int64_t n, std::int64_t c, std::int64_t hw, std::int64_t o, std::int64_t r, GemmMath math,
                     bool wgrad = false) {
  const kernels::GemmConv cv{c, hw, hw, r, r, (r - 1) / 2, (r - 1) / 2, false, wgrad};
  const std::int64_t pixels = cv.oh() * cv.ow(), taps = r * r * c;
  GemmGeometry g = wgrad ? GemmGeometry{o, taps, n * pixels, pixels, hw * hw, taps, math}
                         : GemmGeometry{o, pixels, taps, taps, hw * hw, pixels, math};
  g.conv = cv;
  g.batch = n, g.batch_b = c * hw * hw;
  if (wgrad) g.batch_a = o * pixels;
  else g.batch_d = o * pixels;
  return g;
}

}  // namespace

TEST_CASE("staged stores: tiles of at most 4 k tiles whose rows take aligned 16-byte pieces") {
  // Short products: 256 bf16 are 4 k tiles, 264 are 5.
  CHECK(kernels::staged_stores(staged_plan({1024, 512, 256, 256, 256, 512, GemmMath::bf16})));
  CHECK_FALSE(kernels::staged_stores(staged_plan({1024, 512, 264, 264, 264, 512, GemmMath::bf16})));
  CHECK(kernels::staged_stores(staged_plan({1024, 512, 128, 128, 128, 512, GemmMath::tf32})));
  CHECK_FALSE(kernels::staged_stores(staged_plan({1024, 512, 136, 136, 136, 512, GemmMath::tf32})));
  // Rows of D 300 bf16 apart start pieces off their 16-byte boundaries; 304 apart they do not.
  CHECK_FALSE(kernels::staged_stores(staged_plan({256, 300, 64, 64, 64, 300, GemmMath::bf16})));
  CHECK(kernels::staged_stores(staged_plan({256, 300, 64, 64, 64, 304, GemmMath::bf16})));
  // Split-K's f32 partials: k per split counts (4096 split 16 ways is 4 k tiles a split).
  const GemmGeometry long_k{1024, 16, 4096, 4096, 4096, 16, GemmMath::bf16};
  CHECK_FALSE(kernels::staged_stores(staged_plan(long_k)));
  CHECK(kernels::staged_stores(staged_plan(long_k, GemmTile{128, 16, 16})));
  // Convolutions: a 1x1 forward of 64 TF32 channels (2 k tiles) over 8-wide rows; not a 3x3 one
  // (18 k tiles), not 6-wide rows (pieces of 4 f32 would straddle them), not a weight gradient.
  CHECK(kernels::staged_stores(staged_plan(staged_conv(3, 64, 8, 96, 1, GemmMath::tf32))));
  CHECK_FALSE(kernels::staged_stores(staged_plan(staged_conv(3, 64, 8, 96, 3, GemmMath::tf32))));
  CHECK_FALSE(kernels::staged_stores(staged_plan(staged_conv(3, 64, 6, 96, 1, GemmMath::tf32))));
  CHECK_FALSE(kernels::staged_stores(staged_plan(staged_conv(3, 64, 8, 96, 1, GemmMath::tf32, true))));
  // Transposed tiles store D^T's columns as before.
  CHECK_FALSE(kernels::staged_stores(staged_plan(staged_conv(3, 64, 8, 96, 1, GemmMath::tf32), GemmTile{128, 0, 0, true})));
  // Epilogues that read D back or sum what they store keep the direct stores.
  GemmGeometry acc{1024, 512, 256, 256, 256, 512, GemmMath::bf16};
  kernels::GemmEpilogueHook hook;
  hook.expr = "acc";
  hook.accumulate = true;
  acc.hooks.epilogue = hook;
  CHECK_FALSE(kernels::staged_stores(staged_plan(acc)));
  hook.accumulate = false;
  hook.stats = kernels::HookStats::rows;
  acc.hooks.epilogue = hook;
  CHECK_FALSE(kernels::staged_stores(staged_plan(acc)));
}

TEST_CASE("staged stores take 128 bytes of shared memory per tile row and compile with no local memory") {
  const GemmGeometry short_k{1024, 512, 256, 256, 256, 512, GemmMath::bf16};
  const GemmLaunch l = staged_plan(short_k);
  REQUIRE(kernels::staged_stores(l));
  CHECK(kernels::shared_bytes(l, l.stages) ==
        l.stages * ((l.bm + l.bn) * 128 + 16) + l.bm * 128 + 1024);  // stages, barriers, staging, alignment
  CHECK(l.shared_bytes <= kStagedTarget.max_shared);
  // bf16 and f32 outputs, whole and partial 128-byte chunks, a piece straddling N, split-K's
  // partials, convolution mode's f32 outputs and two consumer warpgroups.
  const std::vector<GemmLaunch> launches{
      l,
      staged_plan(short_k, GemmTile{64, 80}),
      staged_plan({256, 300, 64, 64, 64, 304, GemmMath::bf16}),
      staged_plan({1024, 16, 4096, 4096, 4096, 16, GemmMath::bf16}, GemmTile{128, 16, 16}),
      staged_plan(staged_conv(3, 64, 8, 96, 1, GemmMath::tf32)),
      staged_plan({1000, 200, 128, 128, 128, 200, GemmMath::tf32}, GemmTile{128, 144}),
  };
  std::vector<kiln_test::CompileJob> jobs;
  for (const GemmLaunch& s : launches) {
    CAPTURE(s.g.text());
    CHECK(kernels::staged_stores(s));
    const std::string src = kernels::source(s);
    CHECK(src.find("constexpr bool kStagedStores = true;") != std::string::npos);
    jobs.push_back(kiln_test::generated_job("check_gemm_staged", src, "kiln_gemm_wgmma", 90));
  }
  const kiln_test::CompileSummary r = kiln_test::compile_all(jobs);
  MESSAGE("staged stores: " << r.text());
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    CAPTURE(i);
    const kiln_test::CompileOutcome& o = r.outcomes[i];
    CHECK_MESSAGE(o.error.empty(), o.error);
    const bool writes = o.ptx.find("st.shared.v2.f32") != std::string::npos || o.ptx.find("st.shared.u32") != std::string::npos;
    CHECK(writes);
    CHECK(o.ptx.find("ld.shared.v4.u32") != std::string::npos);
    CHECK(o.ptx.find("__local_depot") == std::string::npos);  // the accumulators stay in registers
  }
}
