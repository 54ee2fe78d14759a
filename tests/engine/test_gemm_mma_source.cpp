// The GEMM family's mma.sync kind (sm_80 and later) compiles with NVRTC for sm_80, sm_86,
// sm_89 and sm_90 in every arithmetic (exact f32 as three TF32 products), tile, layout and
// epilogue, and its plans decline
// what it cannot take; runs without a GPU. GPU tests check its results.
#include <doctest/doctest.h>

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

const kernels::GemmTarget kAmpere{80, 108, 163 * 1024}, kAda{89, 128, 99 * 1024};

}  // namespace

TEST_CASE("mma.sync GEMM kernels compile for sm_80-sm_90 in every arithmetic, tile, layout and epilogue") {
  std::vector<kiln_test::CompileJob> jobs;
  auto add = [&](const std::optional<kernels::GemmLaunch>& l, int arch) {
    kiln_test::add_launch_job(jobs, l, GemmKernel::mma_sync, arch);
  };
  for (GemmMath math : {GemmMath::bf16, GemmMath::f16, GemmMath::tf32, GemmMath::f32})
    for (int layout = 0; layout < (kernels::tf32_mma(math) ? 1 : 4); ++layout)
      for (GemmTile tile : {GemmTile{128, 128}, GemmTile{64, 64}}) {
        const GemmEpilogue e = tile.bm == 64 ? GemmEpilogue::relu_bias : GemmEpilogue::none;
        add(kernels::plan(GemmKernel::mma_sync, packed_product(1000, 296, 520, math, layout & 1, layout & 2, e),
                          kAmpere, tile),
            80);
      }
  // A batch, on the other archs (sm_86 and sm_89 have less shared memory: fewer stages).
  GemmGeometry batch = packed_product(96, 64, 256, GemmMath::bf16, false, true);
  batch.batch = 3, batch.batch_a = 0, batch.batch_b = 256 * 64, batch.batch_d = 96 * 64;
  for (int arch : {86, 89, 90}) add(kernels::plan(GemmKernel::mma_sync, batch, {arch, 84, 99 * 1024}), arch);
  kiln_test::check_launch_jobs(jobs, GemmKernel::mma_sync,
                               {"mma.sync.aligned", "cp.async.cg.shared.global", "ldmatrix.sync.aligned"});
}

TEST_CASE("mma.sync GEMM plans: tiles and stages follow the shape and the arch; the rest is declined") {
  const auto big = kernels::plan(GemmKernel::mma_sync, packed_product(4096, 4096, 4096, GemmMath::bf16), kAmpere);
  REQUIRE(big);
  CHECK((big->bm == 128 && big->bn == 128 && big->stages == 4));
  CHECK(big->text() == "mma 128x128 s4");
  const auto small = kernels::plan(GemmKernel::mma_sync, packed_product(256, 256, 512, GemmMath::bf16), kAmpere);
  REQUIRE(small);
  CHECK((small->bm == 64 && small->bn == 64));  // 16 tiles of 64 fill more SMs than 4 of 128
  const auto ada = kernels::plan(GemmKernel::mma_sync, packed_product(4096, 4096, 4096, GemmMath::tf32), kAda);
  REQUIRE(ada);
  CHECK(ada->stages == 3);  // 32 KiB a stage in 99 KiB
  CHECK(kernels::alternatives(*big, kAmpere).size() == 3);
  // TF32 and exact f32 read K-major only; 16-byte chunks must tile k (K-major) or m and n
  // (MN-major); no hooks or convolution modes; nothing before sm_80.
  CHECK_FALSE(kernels::plan(GemmKernel::mma_sync, packed_product(256, 256, 512, GemmMath::tf32, true), kAmpere));
  CHECK_FALSE(kernels::plan(GemmKernel::mma_sync, packed_product(256, 256, 500, GemmMath::bf16), kAmpere));
  CHECK(kernels::plan(GemmKernel::mma_sync, packed_product(256, 256, 504, GemmMath::bf16), kAmpere));
  CHECK_FALSE(kernels::plan(GemmKernel::mma_sync, packed_product(250, 256, 512, GemmMath::bf16, true), kAmpere));
  CHECK(kernels::plan(GemmKernel::mma_sync, packed_product(256, 256, 512, GemmMath::f32), kAmpere));
  CHECK_FALSE(kernels::plan(GemmKernel::mma_sync, packed_product(256, 256, 512, GemmMath::f32, false, true), kAmpere));
  CHECK_FALSE(kernels::plan(GemmKernel::mma_sync, packed_product(256, 256, 512, GemmMath::bf16), {75, 40, 64 * 1024}));
  GemmGeometry hooked = packed_product(256, 256, 512, GemmMath::bf16);
  hooked.hooks.epilogue = kernels::GemmEpilogueHook{"acc * 2.0f"};
  CHECK_FALSE(kernels::plan(GemmKernel::mma_sync, hooked, kAmpere));
}
