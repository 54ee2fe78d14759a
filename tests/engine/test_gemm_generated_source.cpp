// The generated GEMM kernels (backend/cuda/generated/gemm) compile with NVRTC for sm_90a in
// every arithmetic, tile and epilogue, and their plans decline what they cannot take; runs
// without a GPU. GPU tests check their results.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "backend/cuda/generated/gemm/gemm_internal.h"
#include "backend/cuda/generated/gemm/gemm_plan.h"
#include "compile_check.h"
#include "kiln/runtime/compiler.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/templates.h"

using namespace kiln;
using kernels::GemmEpilogue;
using kernels::GemmGeometry;
using kernels::GemmKernel;
using kernels::GemmMath;
using kernels::GemmTile;

namespace {

const kernels::GemmTarget kHopper{90, 132, 227 * 1024};

GemmGeometry gemm_of(std::int64_t m, std::int64_t n, std::int64_t k, GemmMath math,
                     GemmEpilogue e = GemmEpilogue::none) {
  return {m, n, k, k, k, n, math, e};
}

// A stride-1 weight gradient of `images` images of c channels (hw x hw), o outputs, an r x r
// window padded by r / 2.
GemmGeometry wgrad(std::int64_t o, std::int64_t c, std::int64_t hw, std::int64_t r, std::int64_t images, GemmMath math) {
  const kernels::GemmConv cv{c, hw, hw, r, r, r / 2, r / 2, false, true};
  GemmGeometry g{o, r * r * c, images * cv.oh() * cv.ow(), 0, 0, r * r * c, math};
  g.conv = cv;
  g.batch = images, g.batch_a = o * cv.oh() * cv.ow(), g.batch_b = c * hw * hw;
  return g;
}

// Whether the tuner is offered transposed tiles beside launch `l`.
bool offers_transposed(const kernels::GemmLaunch& l) {
  const std::vector<GemmTile> tiles = kernels::alternatives(l, kHopper);
  return std::any_of(tiles.begin(), tiles.end(), [](const GemmTile& t) { return t.transposed; });
}

}  // namespace

TEST_CASE("generated GEMM kernels compile in every arithmetic, tile, epilogue and layout") {
  std::vector<kiln_test::CompileJob> jobs;
  std::vector<std::vector<std::string>> entries;  // each module's entry points, as its launch lists them
  // Queues launch `l`'s module to be compiled; gives its source for further checks.
  auto add = [&](const std::optional<kernels::GemmLaunch>& l) {
    REQUIRE(l);
    std::string src = kernels::source(*l);
    CHECK(rt::template_placeholders(src).empty());
    jobs.push_back(kiln_test::generated_job("check_gemm_wgmma", src, "kiln_gemm_wgmma", 90));
    entries.push_back(kernels::entry_points(*l));
    return src;
  };
  for (GemmMath math : {GemmMath::bf16, GemmMath::f16, GemmMath::tf32})
    for (GemmTile tile : {GemmTile{128, 256}, GemmTile{128, 128}, GemmTile{64, 128}, GemmTile{128, 16}})
      for (GemmEpilogue e : {GemmEpilogue::none, GemmEpilogue::relu_bias}) {
        CAPTURE(kernels::math_name(math));
        CAPTURE(tile.text());
        const auto l = kernels::plan(GemmKernel::wgmma, gemm_of(1000, 300, 520, math, e), kHopper, tile);
        const std::string src = add(l);
        CHECK(l->shared_bytes <= kHopper.max_shared);
        CHECK(rt::wants_arch_specific(src));
      }
  // 16-bit inputs in every layout, one problem and a batch sharing A (a 1x1 convolution's weights).
  for (GemmMath math : {GemmMath::bf16, GemmMath::f16})
    for (bool a_mn : {false, true})
      for (bool b_mn : {false, true})
        for (std::int64_t batch : {1, 4}) {
          GemmGeometry g{200, 136, 120, a_mn ? 200 : 120, b_mn ? 136 : 120, 136, math, GemmEpilogue::bias, a_mn, b_mn};
          if (batch > 1) g.batch = batch, g.batch_b = 120 * 136, g.batch_d = 200 * 136;
          const auto l = kernels::plan(GemmKernel::wgmma, g, kHopper);
          add(l);
        }
  // TF32 with B MN-major: tiles of D^T, B's rows read into registers; one problem and a batch
  // sharing A (a 1x1 TF32 convolution's forward), 200 and 300 rows of D (one tile, two).
  for (std::int64_t m : {200, 300})
    for (std::int64_t batch : {1, 4}) {
      GemmGeometry g{m, 136, 120, 120, 136, 136, GemmMath::tf32, GemmEpilogue::none, false, true};
      if (batch > 1) g.batch = batch, g.batch_b = 120 * 136, g.batch_d = m * 136;
      const auto l = kernels::plan(GemmKernel::wgmma, g, kHopper, batch > 1 ? GemmTile{64, 0, 0, true} : GemmTile{});
      const std::string src = add(l);
      CHECK(l->transposed);
      CHECK(src.find("kRegA = true") != std::string::npos);
    }
  // Convolution mode: 3x3 and 5x5 windows, the flipped input gradient, TF32, rows wider than a
  // tile, every tile width.
  for (GemmTile tile : {GemmTile{128, 256}, GemmTile{128, 128}, GemmTile{64, 64}})
    for (bool flip : {false, true}) {
      const kernels::GemmConv c{flip ? 32 : 64, 14, flip ? 300 : 56, flip ? 5 : 3, flip ? 5 : 3, flip ? 2 : 1, flip ? 2 : 1, flip};
      GemmGeometry g{64, c.oh() * c.ow(), c.r * c.s * c.c, 0, 0, c.oh() * c.ow(), flip ? GemmMath::tf32 : GemmMath::bf16};
      g.conv = c;
      g.batch = 4, g.batch_b = c.c * c.h * c.w, g.batch_d = 64 * c.oh() * c.ow();
      const auto l = kernels::plan(GemmKernel::wgmma, g, kHopper, tile);
      add(l);
    }
  // Convolution mode with output pixels as rows: 32 channels (the heuristic's), 40 in a tile of
  // 48, 300 in two tiles of 256, TF32 and an odd output width.
  for (std::int64_t m : {32, 40, 300}) {
    const kernels::GemmConv c{16, 9, m == 40 ? 7 : 12, 3, 3, 1, 1, m == 300};
    GemmGeometry g{m, c.oh() * c.ow(), c.r * c.s * c.c, 0, 0, c.oh() * c.ow(), m == 40 ? GemmMath::tf32 : GemmMath::bf16};
    g.conv = c;
    g.batch = 3, g.batch_b = c.c * c.h * c.w, g.batch_d = m * c.oh() * c.ow();
    const auto l = kernels::plan(GemmKernel::wgmma, g, kHopper, m == 32 ? GemmTile{} : GemmTile{64, 0, 0, true});
    const std::string src = add(l);
    CHECK(l->transposed);
    CHECK(src.find("kTransposed = true") != std::string::npos);
  }
  // Transposed weight gradients: 24 outputs (the heuristic's) and 64 in tiles 64 high, MN-major
  // (bf16) and K-major (TF32, 24: two taps a tile).
  for (std::int64_t o : {24, 64}) {
    const kernels::GemmConv c{64, 12, 12, 3, 3, 1, 1, false, true};
    GemmGeometry g{o, 9 * 64, 4 * 144, 0, 0, 9 * 64, o == 24 ? GemmMath::tf32 : GemmMath::bf16};
    g.conv = c;
    g.batch = 4, g.batch_a = o * 144, g.batch_b = 64 * 144;
    const auto l = kernels::plan(GemmKernel::wgmma, g, kHopper, o == 24 ? GemmTile{} : GemmTile{64, 0, 0, true});
    add(l);
    CHECK(l->transposed);
  }
  // Exact f32 (split in the kernel, k as stored): plain products in both tile heights with a
  // bias, and B MN-major in registers (a 1x1 exact f32 convolution's forward).
  for (GemmTile tile : {GemmTile{128, 256}, GemmTile{64, 128}}) {
    const auto l = kernels::plan(GemmKernel::wgmma, gemm_of(1000, 300, 520, GemmMath::f32, GemmEpilogue::bias), kHopper, tile);
    const std::string src = add(l);
    CHECK(src.find("kSplitF32 = true") != std::string::npos);
    CHECK(l->shared_bytes <= kHopper.max_shared);
  }
  {
    GemmGeometry g{64, 136, 120, 120, 136, 136, GemmMath::f32, GemmEpilogue::none, false, true};
    g.batch = 4, g.batch_b = 120 * 136, g.batch_d = 64 * 136;
    const auto l = kernels::plan(GemmKernel::wgmma, g, kHopper);
    const std::string src = add(l);
    CHECK(src.find("kRegA = true") != std::string::npos);
    CHECK(src.find("kSplitF32 = true") != std::string::npos);
  }
  // TF32 and f32 with A MN-major too, shared by a batch (a 1x1 input gradient's w^T): A staged
  // K-major by the NHWC staging kernel, which compiles apart from the tile module.
  for (GemmMath math : {GemmMath::tf32, GemmMath::f32}) {
    GemmGeometry g{70, 196, 40, 70, 200, 200, math, GemmEpilogue::none, true, true};
    g.batch = 3, g.batch_b = 40 * 200, g.batch_d = 70 * 200;
    const auto l = kernels::plan(GemmKernel::wgmma, g, kHopper);
    add(l);
    CHECK(l->transposed);
    CHECK(kernels::stage_a_transposed(l->g));
    CHECK(kernels::entry_points(*l) == std::vector<std::string>{"kiln_gemm_wgmma"});
    g.k = 37, g.batch_b = 37 * 200;  // rows of A^T would not be 16-byte multiples
    CHECK_FALSE(kernels::plan(GemmKernel::wgmma, g, kHopper));
  }
  // Exact f32 in convolution mode (three staged slices of split operands), forward and flipped,
  // with a channel tail past a k tile.
  for (bool flip : {false, true}) {
    const kernels::GemmConv c{flip ? 36 : 64, 14, 14, 3, 3, 1, 1, flip};
    GemmGeometry g{flip ? 24 : 64, c.oh() * c.ow(), c.r * c.s * c.c, 0, 0, c.oh() * c.ow(), GemmMath::f32};
    g.conv = c;
    g.batch = 2, g.batch_b = c.c * c.h * c.w, g.batch_d = g.m * c.oh() * c.ow();
    const auto l = kernels::plan(GemmKernel::wgmma, g, kHopper);
    const std::string src = add(l);
    CHECK(src.find("kSplitF32 = false") != std::string::npos);
    CHECK(kernels::slices(l->g) == 3);  // staged by the sliced staging kernels
    CHECK(src.find("kK = " + std::to_string(3 * g.k)) != std::string::npos);  // k runs over the slices
  }
  // Paired slices (channels in 32s): [hi | lo] staged, each stage's lo tiles loaded beside its hi,
  // forward and flipped, in both tile heights and transposed.
  for (bool flip : {false, true})
    for (GemmTile tile : {GemmTile{}, GemmTile{64, 128}, GemmTile{128, 0, 0, true}}) {
      kernels::GemmConv c{flip ? 64 : 32, 14, 14, 5, 5, 2, 2, flip};
      c.paired = true;
      GemmGeometry g{flip ? 32 : 64, c.oh() * c.ow(), c.r * c.s * c.c, 0, 0, c.oh() * c.ow(), GemmMath::f32};
      g.conv = c;
      g.batch = 3, g.batch_b = c.c * c.h * c.w, g.batch_d = g.m * c.oh() * c.ow();
      const auto l = kernels::plan(GemmKernel::wgmma, g, kHopper, tile);
      REQUIRE(l);
      CHECK(l->text().ends_with(" P"));
      const std::string src = add(l);
      CHECK(src.find("kPaired = true") != std::string::npos);
      CHECK(kernels::slices(l->g) == 2);
    }
  // Exact f32 weight gradients read what TF32 reads: a 3x3 window's images copied per filter
  // column, a 1x1 window's read as stored.
  for (std::int64_t r : {3, 1}) {
    const kernels::GemmConv c{32, 12, 12, r, r, r / 2, r / 2, false, true};
    GemmGeometry g{48, r * r * 32, 5 * 144, 0, 0, r * r * 32, GemmMath::f32};
    g.conv = c;
    g.batch = 5, g.batch_a = 48 * 144, g.batch_b = 32 * 144;
    const auto l = kernels::plan(GemmKernel::wgmma, g, kHopper);
    const std::string src = add(l);
    const kernels::WgradLayout w = kernels::wgrad_layout(g);
    CHECK(w.k_major);
    CHECK(w.stage_images == (r == 3));
    CHECK_FALSE(w.stage_gy);  // rows of 12 pixels: 16-byte multiples
    CHECK(src.find("kImages = 5") != std::string::npos);
    CHECK(src.find("kSplitF32 = true") != std::string::npos);
  }
  // Exact f32 weight gradients through hi and lo copies (paired): gy copied too, no split in the
  // kernel, both tile kinds; a 1x1 window read as stored has no copies to pair.
  for (std::int64_t r : {5, 3})
    for (GemmTile tile : {GemmTile{}, GemmTile{128, 0, 0, true}}) {
      GemmGeometry g = wgrad(64, 32, 14, r, 3, GemmMath::f32);
      g.conv->paired = true;
      CHECK(kernels::wgrad_layout(g).stage_gy);
      const auto l = kernels::plan(GemmKernel::wgmma, g, kHopper, tile);
      REQUIRE(l);
      CHECK(l->text().ends_with(" P"));
      const std::string src = add(l);
      CHECK(src.find("kPaired = true") != std::string::npos);
      CHECK(src.find("kSplitF32 = false") != std::string::npos);
    }
  {
    GemmGeometry g = wgrad(64, 32, 16, 1, 2, GemmMath::f32);
    g.conv->paired = true;
    CHECK_FALSE(kernels::plan(GemmKernel::wgmma, g, kHopper));
  }
  // Paired weight gradients with gy read as stored and split in the kernel, both tile kinds;
  // rows of 14 pixels are padded (copied), so there it does not apply; unpaired it is a mistake.
  for (GemmTile tile : {GemmTile{}, GemmTile{128, 0, 0, true}}) {
    GemmGeometry g = wgrad(64, 32, 12, 3, 3, GemmMath::f32);
    g.conv->paired = g.conv->split_gy = true;
    CHECK_FALSE(kernels::wgrad_layout(g).stage_gy);
    CHECK(kernels::wgrad_layout(g).stage_images);
    const auto l = kernels::plan(GemmKernel::wgmma, g, kHopper, tile);
    REQUIRE(l);
    CHECK(l->text().ends_with(" P G"));
    const std::string src = add(l);
    CHECK(src.find("kSplitGy = true") != std::string::npos);
  }
  {
    GemmGeometry padded = wgrad(64, 32, 14, 3, 3, GemmMath::f32);
    padded.conv->paired = padded.conv->split_gy = true;
    CHECK_FALSE(kernels::plan(GemmKernel::wgmma, padded, kHopper));
    GemmGeometry unpaired = wgrad(64, 32, 12, 3, 3, GemmMath::f32);
    unpaired.conv->split_gy = true;
    CHECK_THROWS_AS(kernels::plan(GemmKernel::wgmma, unpaired, kHopper), ValueError);
  }
  // Exact f32 weight gradients sum at most 64 k tiles a split (batch-1024 conv2: 7168 k tiles,
  // at least 112 splits); TF32 fills the SMs with fewer.
  for (GemmMath math : {GemmMath::f32, GemmMath::tf32}) {
    const auto l = kernels::plan(GemmKernel::wgmma, wgrad(64, 32, 14, 5, 1024, math), kHopper);
    REQUIRE(l);
    CHECK((math == GemmMath::f32 ? l->splits >= 112 : l->splits < 112));
  }
  // Split-K: a narrow product of long k, in every arithmetic.
  for (GemmMath math : {GemmMath::bf16, GemmMath::tf32}) {
    const auto l = kernels::plan(GemmKernel::wgmma, gemm_of(1024, 10, 4096, math), kHopper, GemmTile{128, 16, 8});
    add(l);
    CHECK(l->splits == 8);
  }
  // Weight-gradient mode: channels padded to 64 (C = 32) or not, gy of fewer than 64 channels,
  // both tile heights, every width of atoms; a 1x1 window read as stored in every math; TF32
  // copies of a 5x5 window's images.
  for (GemmMath math : {GemmMath::bf16, GemmMath::tf32}) add(kernels::plan(GemmKernel::wgmma, wgrad(64, 32, 14, 5, 4, math), kHopper));
  // 16-bit read K-major on request, through the copies TF32 reads: gy's rows of 14 padded to 16.
  for (GemmMath math : {GemmMath::bf16, GemmMath::f16}) {
    kernels::GemmConv c{32, 14, 14, 5, 5, 2, 2, false, true};
    c.k_major = true;
    GemmGeometry g{64, 25 * 32, 4 * 196, 0, 0, 25 * 32, math};
    g.conv = c;
    g.batch = 4, g.batch_a = 64 * 196, g.batch_b = 32 * 196;
    const auto l = kernels::plan(GemmKernel::wgmma, g, kHopper);
    const std::string src = add(l);
    const kernels::WgradLayout w = kernels::wgrad_layout(g);
    CHECK((w.k_major && w.stage_gy && w.stage_images && w.row == 16));
    CHECK(src.find("kWgradKMajor = true") != std::string::npos);
    CHECK(l->text().ends_with(" K"));
    CHECK(g.text().ends_with(" wgrad K"));
  }
  {  // K-major reads belong to the weight gradient
    kernels::GemmConv c{32, 14, 14, 5, 5, 2, 2};
    c.k_major = true;
    GemmGeometry g{64, 196, 800, 800, 196, 196, GemmMath::bf16};
    g.conv = c;
    CHECK_THROWS_AS(kernels::plan(GemmKernel::wgmma, g, kHopper), ValueError);
  }
  for (GemmMath math : {GemmMath::bf16, GemmMath::tf32}) {
    const kernels::GemmConv c{40, 8, 8, 1, 1, 0, 0, false, true};
    GemmGeometry g{24, 40, 3 * 64, 0, 0, 40, math};
    g.conv = c;
    g.batch = 3, g.batch_a = 24 * 64, g.batch_b = 40 * 64;
    const auto l = kernels::plan(GemmKernel::wgmma, g, kHopper);
    add(l);
  }
  for (GemmTile tile : {GemmTile{64, 64}, GemmTile{128, 192}, GemmTile{64, 256}})
    for (GemmMath math : {GemmMath::bf16, GemmMath::f16}) {
      const bool narrow = tile.bn == 64;
      const kernels::GemmConv c{narrow ? 32 : 64, 14, 14, 5, 5, 2, 2, false, true};
      const std::int64_t o = narrow ? 24 : 96;
      GemmGeometry g{o, c.r * c.s * c.c, 8 * c.oh() * c.ow(), 0, 0, c.r * c.s * c.c, math};
      g.conv = c;
      g.batch = 8, g.batch_a = o * c.oh() * c.ow(), g.batch_b = c.c * c.h * c.w;
      const auto l = kernels::plan(GemmKernel::wgmma, g, kHopper, tile);
      add(l);
    }
  const kiln_test::CompileSummary r = kiln_test::compile_all(jobs);
  MESSAGE("gemm_wgmma: " << r.text());
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    CAPTURE(i);
    const kiln_test::CompileOutcome& o = r.outcomes[i];
    CHECK_MESSAGE(o.error.empty(), o.error);
    CHECK(o.cubin.size() > 0);
    CHECK(o.ptx.find("wgmma.mma_async.sync.aligned") != std::string::npos);
    CHECK(o.ptx.find("cp.async.bulk.tensor.") != std::string::npos);
    for (const std::string& entry : entries[i]) CHECK(o.ptx.find(entry) != std::string::npos);
    // The staging kernels compile apart (gemm_staging.cu): a module holds its tile kernel only.
    for (const char* staging : {"kiln_nchw_to_nhwc", "kiln_conv_weights_rsc", "kiln_conv_shift_rows", "kiln_gemm_sum_splits"})
      CHECK(o.ptx.find(staging) == std::string::npos);
    CHECK(o.ptx.find(".target sm_90a") != std::string::npos);
    CHECK(kiln_test::every_kernel_waits_for_prior_grids(o.ptx));
    // Accumulators in local memory (an index known only at run time) would not see the
    // asynchronous MMAs' writes; no kernel of the module keeps anything there.
    CHECK(o.ptx.find("__local_depot") == std::string::npos);
  }
}

TEST_CASE("the tile engine's staging kernels: one shape-generic spec per kind and slicing, f32 alone sliced") {
  // The registry holds them (so `jitcc warm` compiles them); each source keeps only its kind.
  for (const char* op : {"gemm_weights_rsc", "gemm_nchw_to_nhwc", "gemm_shift_rows", "gemm_sum_splits"}) {
    CAPTURE(op);
    const rt::KernelSpec* spec = rt::find_kernel(op);
    REQUIRE(spec);
    CHECK(spec->dtypes.size() == 3);
    const std::string src = rt::instantiate_kernel(*spec, DTypes{DType::bf16}, 1);
    CHECK(rt::template_placeholders(src).empty());
    CHECK(src.find("#define KILN_SLICES 1") != std::string::npos);
    CHECK(src.find("__nv_bfloat16") != std::string::npos);
  }
  const rt::KernelSpec* sliced = rt::find_kernel("gemm_nchw_to_nhwc_sliced");
  REQUIRE(sliced);
  CHECK(sliced->dtypes == std::vector<DTypes>{DTypes{DType::f32}});
  CHECK(sliced->variants == std::vector<std::uint32_t>{2, 3});
  CHECK(rt::instantiate_kernel(*sliced, DTypes{DType::f32}, 3).find("#define KILN_SLICES 3") != std::string::npos);
  CHECK(rt::find_kernel("gemm_shift_rows_sliced")->variants == std::vector<std::uint32_t>{2});
  CHECK_FALSE(rt::find_kernel("gemm_sum_splits_sliced"));
  // Slices are f32's alone, and the sum writes one value: both refused before any GPU work.
  CHECK_THROWS_WITH_AS(kernels::staging_function(kernels::GemmStaging::nchw_to_nhwc, DType::bf16, 2, 0),
                       doctest::Contains("kiln_nchw_to_nhwc writes no 2 slices of bf16"), ValueError);
  CHECK_THROWS_WITH_AS(kernels::staging_function(kernels::GemmStaging::sum_splits, DType::f32, 3, 0),
                       doctest::Contains("kiln_gemm_sum_splits writes no 3 slices of f32"), ValueError);
}

TEST_CASE("GEMM plans: tiles follow the shape; what TMA or the arch cannot take is declined") {
  const auto wide = kernels::plan(GemmKernel::wgmma, gemm_of(8192, 8192, 8192, GemmMath::bf16), kHopper);
  REQUIRE(wide);
  CHECK(wide->bn == 256);
  CHECK(wide->grid == 132);  // persistent: one block per SM
  const auto narrow = kernels::plan(GemmKernel::wgmma, gemm_of(1024, 10, 4096, GemmMath::tf32), kHopper);
  REQUIRE(narrow);
  CHECK(narrow->bn == 16);
  CHECK(narrow->grid == 8);
  // A row stride of 784 bf16 elements is 1568 bytes, a multiple of 16; 785 is not.
  CHECK(kernels::plan(GemmKernel::wgmma, {128, 64, 784, 784, 784, 64, GemmMath::bf16}, kHopper));
  CHECK_FALSE(kernels::plan(GemmKernel::wgmma, {128, 64, 785, 785, 785, 64, GemmMath::bf16}, kHopper));
  CHECK_FALSE(kernels::plan(GemmKernel::wgmma, gemm_of(128, 64, 64, GemmMath::bf16), {80, 108, 163 * 1024}));
  CHECK_FALSE(kernels::plan(GemmKernel::wgmma, gemm_of(128, 64, 0, GemmMath::bf16), kHopper));
  CHECK_FALSE(kernels::plan(GemmKernel::wgmma, gemm_of(128, 64, 64, GemmMath::bf16), kHopper, GemmTile{96, 64}));
  // TF32 MMAs read K-major tiles only from shared memory: an MN-major A is staged K-major where
  // it is dense (rows of m), declined where it is not; an MN-major B is taken in tiles of D^T
  // with B's rows read into registers (no hooks there, no other tiles).
  const auto tf32_at = kernels::plan(
      GemmKernel::wgmma, {64, 64, 64, 64, 64, 64, GemmMath::tf32, GemmEpilogue::none, true, false}, kHopper);
  REQUIRE(tf32_at);
  CHECK(kernels::stage_a_transposed(tf32_at->g));
  CHECK_FALSE(kernels::plan(GemmKernel::wgmma,
                            {64, 64, 64, 72, 64, 64, GemmMath::tf32, GemmEpilogue::none, true, false}, kHopper));
  const auto tf32_bt =
      kernels::plan(GemmKernel::wgmma, {64, 64, 64, 64, 64, 64, GemmMath::tf32, GemmEpilogue::none, false, true}, kHopper);
  REQUIRE(tf32_bt);
  CHECK(tf32_bt->transposed);
  CHECK(tf32_bt->bn == 64);  // D's 64 rows as columns of the tile
  CHECK_FALSE(kernels::plan(GemmKernel::wgmma,
                            {64, 64, 64, 64, 64, 64, GemmMath::tf32, GemmEpilogue::bias, false, true}, kHopper));
  CHECK_FALSE(kernels::plan(GemmKernel::wgmma,
                            {64, 64, 64, 64, 64, 64, GemmMath::tf32, GemmEpilogue::none, false, true}, kHopper,
                            GemmTile{128, 64}));
  // An MN-major B (16-bit) comes in atoms of 64 columns.
  const auto mn = kernels::plan(GemmKernel::wgmma,
                                {1024, 10, 64, 64, 16, 10, GemmMath::bf16, GemmEpilogue::none, false, true}, kHopper);
  REQUIRE(mn);
  CHECK(mn->bn == 64);
  CHECK_FALSE(kernels::plan(GemmKernel::wgmma,
                            {1024, 10, 64, 64, 16, 10, GemmMath::bf16, GemmEpilogue::none, false, true}, kHopper,
                            GemmTile{128, 16}));
  // Batches: outputs must not overlap; operands may be shared (stride 0) or apart.
  GemmGeometry batched{64, 64, 64, 64, 64, 64, GemmMath::bf16};
  batched.batch = 2, batched.batch_b = 64 * 64, batched.batch_d = 64 * 64;
  CHECK(kernels::plan(GemmKernel::wgmma, batched, kHopper));
  batched.batch_d = 64;
  CHECK_FALSE(kernels::plan(GemmKernel::wgmma, batched, kHopper));
  batched.batch_d = 64 * 64, batched.batch_a = 8;
  CHECK_FALSE(kernels::plan(GemmKernel::wgmma, batched, kHopper));
  // Operands: 16-byte aligned bases, and a bias where the epilogue reads one.
  const auto l = kernels::plan(GemmKernel::wgmma, gemm_of(64, 64, 64, GemmMath::bf16, GemmEpilogue::bias), kHopper);
  REQUIRE(l);
  CHECK(kernels::operands_fit(*l, {0x1000, 0x2000, 0x3000, 0x4000}));
  CHECK_FALSE(kernels::operands_fit(*l, {0x1008, 0x2000, 0x3000, 0x4000}));
  CHECK_FALSE(kernels::operands_fit(*l, {0x1000, 0x2000, 0x3000, 0}));
  CHECK_THROWS_AS(kernels::launch(*l, {0x1008, 0x2000, 0x3000, 0x4000, nullptr}), ValueError);
  // Split-K: offered where the tiles fill under half the SMs; every split has k tiles; only a
  // plain dense product (no epilogue, one problem) takes it.
  const auto narrow_k = kernels::plan(GemmKernel::wgmma, gemm_of(1024, 10, 4096, GemmMath::bf16), kHopper);
  REQUIRE(narrow_k);
  bool offered = false;
  for (GemmTile t : kernels::alternatives(*narrow_k, kHopper)) offered = offered || t.splits > 1;
  CHECK(offered);
  const auto seven = kernels::plan(GemmKernel::wgmma, gemm_of(1024, 10, 4096, GemmMath::bf16), kHopper, GemmTile{128, 16, 60});
  REQUIRE(seven);
  CHECK(seven->splits == 32);  // 64 k tiles: 60 ways would leave splits empty; two tiles each
  CHECK(seven->text() == "wgmma 128x16 s8 k32");
  CHECK_FALSE(kernels::plan(GemmKernel::wgmma, gemm_of(1024, 10, 4096, GemmMath::bf16, GemmEpilogue::bias), kHopper,
                            GemmTile{128, 16, 4}));
  for (GemmTile t : kernels::alternatives(*wide, kHopper)) CHECK(t.splits == 0);  // fills the SMs already
}

TEST_CASE("GEMM plans in convolution mode: boxes of whole output rows; what TMA cannot step is declined") {
  auto conv = [](std::int64_t c, std::int64_t h, std::int64_t w, std::int64_t r, std::int64_t pad, GemmMath math) {
    const kernels::GemmConv cv{c, h, w, r, r, pad, pad};
    GemmGeometry g{64, cv.oh() * cv.ow(), r * r * c, 0, 0, cv.oh() * cv.ow(), math};
    g.conv = cv;
    return g;
  };
  const kernels::GemmConv res{64, 56, 56, 3, 3, 1, 1};
  CHECK(kernels::conv_box(res, 256).w == 56);  // four whole rows of 56 in a tile of 256
  CHECK(kernels::conv_box(res, 256).h == 4);
  CHECK(kernels::conv_box(res, 64).h == 1);
  CHECK(kernels::conv_box({64, 4, 500, 3, 3, 1, 1}, 256).w == 256);  // a row in pieces
  CHECK(kernels::conv_box({64, 2, 8, 3, 3, 1, 1}, 256).h == 2);      // no more rows than the output has
  CHECK(kernels::plan(GemmKernel::wgmma, conv(64, 56, 56, 3, 1, GemmMath::bf16), kHopper));
  CHECK(kernels::plan(GemmKernel::wgmma, conv(32, 14, 14, 5, 2, GemmMath::bf16), kHopper));  // NHWC: any width
  CHECK(kernels::plan(GemmKernel::wgmma, conv(64, 16, 16, 3, 1, GemmMath::tf32), kHopper));
  CHECK(kernels::plan(GemmKernel::wgmma, conv(64, 16, 16, 3, 1, GemmMath::f32), kHopper));
  CHECK(kernels::plan(GemmKernel::wgmma, gemm_of(128, 64, 64, GemmMath::f32), kHopper));
  CHECK_FALSE(kernels::plan(GemmKernel::wgmma, conv(12, 16, 16, 3, 1, GemmMath::bf16), kHopper));  // 24-byte channel rows
  CHECK_FALSE(kernels::plan(GemmKernel::wgmma, conv(64, 16, 16, 3, 3, GemmMath::bf16), kHopper));  // padding past the filter
  GemmGeometry prologue = conv(64, 16, 16, 3, 1, GemmMath::bf16);
  prologue.hooks.prologue = kernels::GemmPrologueHook{"a", {}};
  CHECK_FALSE(kernels::plan(GemmKernel::wgmma, prologue, kHopper));  // A is the weights
  // Few output channels: pixels as rows, channels as columns; 64 offer it to the tuner; hooks
  // (indexed by D's rows) keep channels as rows.
  GemmGeometry few = conv(64, 16, 16, 3, 1, GemmMath::bf16);
  few.m = 24;
  const auto px = kernels::plan(GemmKernel::wgmma, few, kHopper);
  REQUIRE(px);
  CHECK(px->transposed);
  CHECK(px->bn == 32);
  CHECK(px->text().ends_with(" T"));
  const auto sixty_four = kernels::plan(GemmKernel::wgmma, conv(64, 16, 16, 3, 1, GemmMath::bf16), kHopper);
  REQUIRE(sixty_four);
  CHECK_FALSE(sixty_four->transposed);
  CHECK(offers_transposed(*sixty_four));
  few.hooks.epilogue = kernels::GemmEpilogueHook{"acc * 2.0f", {}};
  const auto hooked = kernels::plan(GemmKernel::wgmma, few, kHopper);
  REQUIRE(hooked);
  CHECK_FALSE(hooked->transposed);
  CHECK_FALSE(kernels::plan(GemmKernel::wgmma, few, kHopper, GemmTile{128, 0, 0, true}));
  CHECK_FALSE(kernels::plan(GemmKernel::wgmma, gemm_of(32, 64, 64, GemmMath::bf16), kHopper, GemmTile{128, 0, 0, true}));
  GemmGeometry wrong = conv(64, 16, 16, 3, 1, GemmMath::bf16);
  wrong.n = 100;
  CHECK_THROWS_AS(kernels::plan(GemmKernel::wgmma, wrong, kHopper), ValueError);
  // Paired f32 slices: a stage twice the bytes (so fewer stages), channels in whole k tiles, and
  // exact f32 only.
  GemmGeometry paired = conv(64, 28, 28, 3, 1, GemmMath::f32);
  paired.conv->paired = true;
  const auto p = kernels::plan(GemmKernel::wgmma, paired, kHopper);
  const auto unpaired = kernels::plan(GemmKernel::wgmma, conv(64, 28, 28, 3, 1, GemmMath::f32), kHopper);
  REQUIRE(p);
  REQUIRE(unpaired);
  CHECK(p->stages < unpaired->stages);
  CHECK(p->stages >= 2);
  CHECK(p->bm == unpaired->bm);
  CHECK(p->bn == unpaired->bn);
  CHECK(p->text().ends_with(" P"));
  GemmGeometry ragged = conv(48, 28, 28, 3, 1, GemmMath::f32);
  ragged.conv->paired = true;
  CHECK_FALSE(kernels::plan(GemmKernel::wgmma, ragged, kHopper));  // 48 channels: a k tile would span both slices
  GemmGeometry sixteen_bit = conv(64, 28, 28, 3, 1, GemmMath::bf16);
  sixteen_bit.conv->paired = true;
  CHECK_THROWS_AS(kernels::plan(GemmKernel::wgmma, sixteen_bit, kHopper), ValueError);
}

TEST_CASE("GEMM plans in weight-gradient mode: tiles that pad the taps least, pixels split to fill the SMs") {
  // 56 x 56 pixels in boxes of 8 x 8 pad nothing; 14 x 14 pads least in 16 x 4 (the first found).
  CHECK(kernels::wgrad_box({64, 56, 56, 3, 3, 1, 1, false, true}).w == 8);
  CHECK(kernels::wgrad_box({64, 14, 14, 5, 5, 2, 2, false, true}).w * kernels::wgrad_box({64, 14, 14, 5, 5, 2, 2, false, true}).h == 64);
  CHECK(kernels::wgrad_layout(wgrad(64, 32, 14, 5, 2, GemmMath::bf16)).channels == 64);  // 16-bit: staged NHWC
  CHECK(kernels::wgrad_layout(wgrad(64, 72, 14, 5, 2, GemmMath::bf16)).channels == 128);
  // A 1x1 window reads gy and the images as stored (K-major) where an image is a multiple of
  // 16 bytes. TF32 is K-major always: 14 pixels of 4 bytes pad to 16 per row, and the images
  // are copied once per filter column with oh + r - 1 rows.
  const kernels::WgradLayout as_stored = kernels::wgrad_layout(wgrad(64, 256, 56, 1, 64, GemmMath::bf16));
  CHECK(as_stored.k_major);
  CHECK_FALSE(as_stored.stage_images);
  CHECK_FALSE(as_stored.stage_gy);
  CHECK(kernels::wgrad_layout(wgrad(64, 72, 14, 1, 2, GemmMath::tf32)).channels == 80);
  const kernels::WgradLayout tf32 = kernels::wgrad_layout(wgrad(64, 32, 14, 5, 2, GemmMath::tf32));
  CHECK(tf32.k_major);
  CHECK(tf32.stage_gy);
  CHECK(tf32.stage_images);
  CHECK(tf32.row == 16);
  CHECK(tf32.rows == 18);
  CHECK(tf32.bn == 32);
  const auto five = kernels::plan(GemmKernel::wgmma, wgrad(64, 32, 14, 5, 2, GemmMath::tf32), kHopper);
  REQUIRE(five);
  CHECK(five->bn == 160);  // 25 taps of 32 channels, five a tile
  const auto res_tf32 = kernels::plan(GemmKernel::wgmma, wgrad(64, 64, 56, 3, 64, GemmMath::tf32), kHopper);
  REQUIRE(res_tf32);
  CHECK(res_tf32->bn == 192);  // 9 taps of 64, three a tile
  CHECK(kernels::plan(GemmKernel::wgmma, wgrad(64, 64, 56, 3, 64, GemmMath::tf32), kHopper, GemmTile{64, 64}));
  CHECK_FALSE(kernels::plan(GemmKernel::wgmma, wgrad(64, 64, 56, 3, 64, GemmMath::tf32), kHopper, GemmTile{64, 96}));
  CHECK(kernels::wgrad_layout(wgrad(64, 320, 14, 3, 2, GemmMath::tf32)).bn == 160);  // two tiles a tap
  // Transposed tiles (dW^T) for few outputs in the MN-major layout: BM of dW's columns, its rows in 64s.
  const auto few = kernels::plan(GemmKernel::wgmma, wgrad(24, 64, 14, 3, 8, GemmMath::bf16), kHopper);
  REQUIRE(few);
  CHECK(few->transposed);
  CHECK(few->bm == 128);
  CHECK(few->bn == 64);
  const auto res_bf16 = kernels::plan(GemmKernel::wgmma, wgrad(64, 64, 56, 3, 64, GemmMath::bf16), kHopper);
  REQUIRE(res_bf16);
  CHECK_FALSE(res_bf16->transposed);
  CHECK(offers_transposed(*res_bf16));
  // K-major (TF32): tiles of whole taps (two of 64 channels in 128) or a tap in pieces; 48
  // channels neither divide nor fill 64 or 128.
  const auto few_tf32 = kernels::plan(GemmKernel::wgmma, wgrad(24, 64, 14, 3, 8, GemmMath::tf32), kHopper);
  REQUIRE(few_tf32);
  CHECK(few_tf32->transposed);
  CHECK(few_tf32->bm == 128);
  CHECK(few_tf32->bn == 32);
  CHECK_FALSE(kernels::plan(GemmKernel::wgmma, wgrad(24, 48, 14, 3, 8, GemmMath::tf32), kHopper, GemmTile{128, 0, 0, true}));
  CHECK_FALSE(kernels::wgrad_layout(wgrad(64, 256, 7, 1, 2, GemmMath::bf16)).k_major);  // 49 pixels: 98 bytes
  CHECK(kernels::plan(GemmKernel::wgmma, wgrad(64, 256, 7, 1, 2, GemmMath::bf16), kHopper));
  CHECK(kernels::plan(GemmKernel::wgmma, wgrad(64, 256, 7, 1, 2, GemmMath::tf32), kHopper));
  const auto proj = kernels::plan(GemmKernel::wgmma, wgrad(64, 256, 56, 1, 64, GemmMath::tf32), kHopper);
  REQUIRE(proj);
  CHECK(proj->bn == 256);  // a tap's 256 channels in one tile
  CHECK(proj->splits == 131);  // 64 images x 98 boxes of 32 pixels, 48 boxes a split
  const auto res = kernels::plan(GemmKernel::wgmma, wgrad(64, 64, 56, 3, 64, GemmMath::bf16), kHopper);
  REQUIRE(res);
  CHECK(res->bm == 64);
  CHECK(res->bn == 192);  // 9 taps of 64 channels in three tiles, none padded
  CHECK(res->splits == 44);
  CHECK(res->grid == 132);
  const auto tiny = kernels::plan(GemmKernel::wgmma, wgrad(64, 64, 8, 3, 1, GemmMath::bf16), kHopper);
  REQUIRE(tiny);
  CHECK(tiny->splits == 1);  // one k tile: nothing to split
  CHECK(kernels::plan(GemmKernel::wgmma, wgrad(64, 64, 16, 3, 2, GemmMath::tf32), kHopper));
  CHECK_FALSE(kernels::plan(GemmKernel::wgmma, wgrad(12, 64, 16, 3, 2, GemmMath::bf16), kHopper));  // 24-byte gy rows
  GemmGeometry hooked = wgrad(64, 64, 16, 3, 2, GemmMath::bf16);
  hooked.hooks.epilogue = kernels::GemmEpilogueHook{"acc * 2.0f"};
  CHECK_FALSE(kernels::plan(GemmKernel::wgmma, hooked, kHopper));  // partials are summed after the kernel
  GemmGeometry flipped = wgrad(64, 64, 16, 3, 2, GemmMath::bf16);
  flipped.conv->flip = true;
  CHECK_THROWS_AS(kernels::plan(GemmKernel::wgmma, flipped, kHopper), ValueError);
  GemmGeometry wrong = wgrad(64, 64, 16, 3, 2, GemmMath::bf16);
  wrong.k = 100;
  CHECK_THROWS_AS(kernels::plan(GemmKernel::wgmma, wrong, kHopper), ValueError);
  // Splits that fill whole waves: res128's exact f32 gradient (9 tiles of 128x128, 1600 k tiles of
  // at most 64 a split) takes 29 splits, two waves of 56 k tiles, not 25 of 64 (a third wave idle).
  {
    GemmGeometry g = wgrad(128, 128, 28, 3, 64, GemmMath::f32);
    g.conv->paired = true;
    const auto l = kernels::plan(GemmKernel::wgmma, g, kHopper);
    REQUIRE(l);
    CHECK(l->bm == 128);
    CHECK(l->bn == 128);
    CHECK(l->splits == 29);
  }
  // A 16-bit weight gradient summed into f32 (autocast): the same tile kernel and module, D in
  // f32; TF32 and exact f32 ones, and the other modes, have no such form.
  {
    const GemmGeometry low = wgrad(64, 32, 14, 5, 2, GemmMath::bf16);
    GemmGeometry wide = low;
    wide.conv->f32_out = true;
    const auto a = kernels::plan(GemmKernel::wgmma, low, kHopper), b = kernels::plan(GemmKernel::wgmma, wide, kHopper);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(kernels::output_dtype(a->g) == DType::bf16);
    CHECK(kernels::output_dtype(b->g) == DType::f32);
    CHECK(kernels::source(*a) == kernels::source(*b));
    CHECK(a->text() == b->text());
    GemmGeometry tf32 = wgrad(64, 32, 14, 5, 2, GemmMath::tf32);
    tf32.conv->f32_out = true;
    CHECK_FALSE(kernels::plan(GemmKernel::wgmma, tf32, kHopper));
  }
}

TEST_CASE("NVRTC targets sm_90a only for sources that define KILN_ARCH_SPECIFIC") {
  CHECK(rt::wants_arch_specific("// header\n#define KILN_ARCH_SPECIFIC 1\nint x;"));
  CHECK(rt::wants_arch_specific("#define KILN_ARCH_SPECIFIC 1\n"));
  CHECK_FALSE(rt::wants_arch_specific("// #define KILN_ARCH_SPECIFIC 1\n"));
  const auto opts = rt::nvrtc_options(90, true);
  CHECK(std::find(opts.begin(), opts.end(), "-arch=sm_90a") != opts.end());
}
