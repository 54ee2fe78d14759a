// The generated convolution kernels (backend/cuda/generated/conv) compile with NVRTC for
// sm_80 and sm_90 in every pass, kind and arithmetic, over the shapes their tiling treats
// differently (split-K, groups, strides, odd sizes); runs without a GPU. GPU tests check their
// results.
#include <doctest/doctest.h>

#include <string>

#include "backend/cuda/generated/conv/conv_plan.h"
#include "kiln/runtime/compiler.h"
#include "kiln/runtime/templates.h"
#include "compile_check.h"

using namespace kiln;
using kernels::ConvGeometry;
using kernels::ConvKernel;
using kernels::ConvMath;
using kernels::ConvPass;
using kernels::ConvTile;

namespace {

const kernels::ConvTarget kH100{132, 227 * 1024};

// n, c, h, w, o, kh, kw, stride, pad, dilation, groups; output sizes derived.
ConvGeometry make(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w, std::int64_t o, std::int64_t k,
                  std::int64_t st, std::int64_t pad, std::int64_t dil, std::int64_t groups) {
  const std::int64_t oh = (h + 2 * pad - dil * (k - 1) - 1) / st + 1, ow = (w + 2 * pad - dil * (k - 1) - 1) / st + 1;
  return {n, c, h, w, o, k, k, oh, ow, st, st, pad, pad, dil, dil, groups};
}

// Kind k's launch for dtype t (f32 through TF32 unless `tf32` is false), or none.
std::optional<kernels::ConvLaunch> launch_of(ConvKernel k, ConvPass pass, const ConvGeometry& g, DType t,
                                             bool tf32 = true, ConvTile tile = {}) {
  const auto math = kernels::conv_math(t, t, t, tf32);
  return math ? kernels::plan(k, pass, g, t, *math, kH100, tile) : std::nullopt;
}

// Its source, or "" where the kind does not apply.
std::string source_of(ConvKernel k, ConvPass pass, const ConvGeometry& g, DType t, bool tf32 = true,
                      ConvTile tile = {}) {
  const auto l = launch_of(k, pass, g, t, tf32, tile);
  return l ? kernels::source(*l) : std::string();
}

// Kind k's sources in bf16, f16 and TF32 for every pass and shape given, each required to apply
// and be fully instantiated (the source becomes a generated template, instantiated again).
std::vector<std::string> sources_for(ConvKernel k, std::initializer_list<ConvPass> passes,
                                     std::initializer_list<ConvGeometry> shapes) {
  std::vector<std::string> sources;
  for (DType t : {DType::bf16, DType::f16, DType::f32})
    for (ConvPass pass : passes)
      for (const ConvGeometry& s : shapes) {
        CAPTURE(kernels::pass_name(pass));
        CAPTURE(s.text());
        sources.push_back(source_of(k, pass, s, t));
        REQUIRE_FALSE(sources.back().empty());
        CHECK(rt::template_placeholders(sources.back()).empty());
      }
  return sources;
}

// Compiles the sources (for each arch, through the test run's cache, on every thread) and
// checks that each compiled and its PTX holds `needle`. Returns how many compiled.
int check_compiles(std::string_view kind, const std::vector<std::string>& sources, const std::string& entry,
                   const std::string& needle, std::initializer_list<int> archs = {90}) {
  std::vector<kiln_test::CompileJob> jobs;
  for (const std::string& src : sources)
    for (int arch : archs) jobs.push_back(kiln_test::generated_job(kind, src, entry, arch));
  const kiln_test::CompileSummary r = kiln_test::compile_all(jobs);
  MESSAGE(kind << ": " << r.text());
  int ok = 0;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    CAPTURE(i);
    const kiln_test::CompileOutcome& o = r.outcomes[i];
    CHECK_MESSAGE(o.error.empty(), o.error);
    CHECK(o.cubin.size() > 0);
    CHECK(o.ptx.find(needle) != std::string::npos);
    if (jobs[i].arch >= 90) CHECK(kiln_test::every_kernel_waits_for_prior_grids(o.ptx));
    ok += o.error.empty() && o.ptx.find(needle) != std::string::npos;
  }
  return ok;
}

}  // namespace

TEST_CASE("generated convolution kernels compile for every pass and MMA type") {
  const std::vector<std::string> sources = sources_for(
      ConvKernel::igemm, {ConvPass::forward, ConvPass::grad_input, ConvPass::grad_weight},
      {
          make(128, 1, 28, 28, 32, 5, 1, 2, 1, 1),   // the MNIST cnn's conv1
          make(128, 32, 14, 14, 64, 5, 1, 2, 1, 1),  // and conv2: split-K weight gradient
          make(3, 6, 9, 7, 4, 3, 2, 1, 2, 2),        // strided, dilated, grouped, odd
          make(1, 5, 4, 4, 130, 1, 1, 0, 1, 1),      // 1x1, batch 1, many outputs
      });
  CHECK(check_compiles("check_conv_igemm", sources, "kiln_conv_igemm", "mma.sync.aligned", {80, 90}) == 3 * 3 * 4 * 2);
}

TEST_CASE("patch convolutions compile where they apply: stride 1, channels in blocks of 8") {
  const ConvGeometry conv2 = make(128, 32, 14, 14, 64, 5, 1, 2, 1, 1), grouped = make(2, 32, 9, 11, 64, 3, 1, 2, 2, 2);
  const ConvGeometry speedrun2 = make(256, 24, 12, 12, 32, 3, 1, 0, 1, 1);  // 24 channels: zero-padded to 32
  const std::vector<std::string> sources =
      sources_for(ConvKernel::patch, {ConvPass::forward, ConvPass::grad_input}, {conv2, grouped, speedrun2});
  CHECK(check_compiles("check_conv_patch", sources, "kiln_conv_patch", "mma.sync.aligned") == 18);
  // Strided, or 1 input channel (the MNIST cnn's conv1), or padding wider than the kernel's
  // reach for the input gradient: the patch kernel declines, the implicit GEMM takes them.
  CHECK_FALSE(launch_of(ConvKernel::patch, ConvPass::forward, make(2, 32, 9, 9, 8, 3, 2, 1, 1, 1), DType::bf16));
  CHECK_FALSE(launch_of(ConvKernel::patch, ConvPass::forward, make(128, 1, 28, 28, 32, 5, 1, 2, 1, 1), DType::bf16));
  CHECK_FALSE(launch_of(ConvKernel::patch, ConvPass::grad_input, make(2, 32, 9, 9, 16, 3, 1, 3, 1, 1), DType::bf16));
  CHECK_FALSE(launch_of(ConvKernel::patch, ConvPass::grad_weight, make(128, 32, 14, 14, 64, 5, 1, 2, 1, 1), DType::bf16));
  // Exact f32 runs on the CUDA cores, which only the implicit GEMM does.
  CHECK_FALSE(launch_of(ConvKernel::patch, ConvPass::forward, make(128, 32, 14, 14, 64, 5, 1, 2, 1, 1), DType::f32, false));
  // Forwards whose blocks take every channel also sum them for a batch norm (ConvOperands::
  // totals): the blocks' partials in f32, a column a block, which the batch norm adds up.
  std::vector<std::string> with_totals;
  for (DType t : {DType::bf16, DType::f32}) {
    const auto l = launch_of(ConvKernel::patch, ConvPass::forward, speedrun2, t);
    REQUIRE(l);
    const auto w = kernels::with_totals(*l, kH100);
    REQUIRE(w);
    CHECK(kernels::stats_floats(*l) == 0);
    const std::int64_t blocks = speedrun2.n * std::get<kernels::PatchPlan>(w->plan).bands;
    CHECK(kernels::stats_floats(*w) == 2 * speedrun2.o * blocks);
    with_totals.push_back(kernels::source(*w));
  }
  CHECK(check_compiles("check_conv_patch_totals", with_totals, "kiln_conv_patch", "shfl.sync.bfly") == 2);
  // Not for input gradients, groups, or channels over several blocks (conv2's 64 in 32s).
  CHECK_FALSE(kernels::with_totals(*launch_of(ConvKernel::patch, ConvPass::grad_input, speedrun2, DType::bf16), kH100));
  CHECK_FALSE(kernels::with_totals(*launch_of(ConvKernel::patch, ConvPass::forward, grouped, DType::bf16), kH100));
  CHECK_FALSE(kernels::with_totals(*launch_of(ConvKernel::patch, ConvPass::forward, conv2, DType::bf16), kH100));
}

TEST_CASE("weight-gradient kernels compile for stride-1 convs with channels in blocks of 8") {
  const std::vector<std::string> sources =
      sources_for(ConvKernel::wgrad, {ConvPass::grad_weight},
                  {make(128, 32, 14, 14, 64, 5, 1, 2, 1, 1), make(3, 40, 6, 7, 70, 3, 1, 1, 1, 1),
                   make(2, 32, 9, 11, 64, 3, 1, 2, 2, 2)});
  CHECK(check_compiles("check_conv_wgrad", sources, "kiln_conv_wgrad", "mma.sync.aligned") == 9);
  CHECK_FALSE(launch_of(ConvKernel::wgrad, ConvPass::grad_weight, make(128, 1, 28, 28, 32, 5, 1, 2, 1, 1), DType::bf16));
  CHECK_FALSE(launch_of(ConvKernel::wgrad, ConvPass::grad_weight, make(2, 32, 9, 9, 8, 3, 2, 1, 1, 1), DType::bf16));
  CHECK_FALSE(launch_of(ConvKernel::wgrad, ConvPass::forward, make(128, 32, 14, 14, 64, 5, 1, 2, 1, 1), DType::bf16));
}

TEST_CASE("small weight-gradient kernels compile for few kernel rows, sliding or strided") {
  const std::vector<std::string> sources =
      sources_for(ConvKernel::wgrad_small, {ConvPass::grad_weight},
                  {make(256, 1, 28, 28, 24, 5, 1, 0, 1, 1), make(128, 1, 28, 28, 32, 5, 1, 2, 1, 1),
                   make(2, 3, 10, 11, 5, 3, 2, 1, 2, 1)});
  CHECK(check_compiles("check_conv_wgrad_small", sources, "kiln_conv_wgrad_small", "kiln_conv_wgrad_small_reduce") ==
        9);
  // Its f32 FMAs serve exact f32 too (TF32 off), where a thread sums at most 1024 products: 100
  // images take three bands an image, 11 rows of 64 pixels a thread; 300 take whole images, 32 rows.
  CHECK(launch_of(ConvKernel::wgrad_small, ConvPass::grad_weight, make(128, 1, 28, 28, 32, 5, 1, 2, 1, 1), DType::f32,
                  false));
  CHECK(launch_of(ConvKernel::wgrad_small, ConvPass::grad_weight, make(256, 1, 28, 28, 24, 5, 1, 0, 1, 1), DType::f32,
                  false));
  CHECK(launch_of(ConvKernel::wgrad_small, ConvPass::grad_weight, make(100, 8, 64, 64, 4, 3, 1, 1, 1, 1), DType::f32,
                  false));
  CHECK_FALSE(launch_of(ConvKernel::wgrad_small, ConvPass::grad_weight, make(300, 8, 64, 64, 4, 3, 1, 1, 1, 1),
                        DType::f32, false));
  // The batch is the kernel's argument: the cnn's conv1 at 128 and its epoch's last step of 96
  // (an image a block both) share one module; 600 images, four a block, do not.
  const std::string conv1 =
      source_of(ConvKernel::wgrad_small, ConvPass::grad_weight, make(128, 1, 28, 28, 32, 5, 1, 2, 1, 1), DType::bf16);
  CHECK_FALSE(conv1.empty());
  CHECK(source_of(ConvKernel::wgrad_small, ConvPass::grad_weight, make(96, 1, 28, 28, 32, 5, 1, 2, 1, 1),
                  DType::bf16) == conv1);
  CHECK(source_of(ConvKernel::wgrad_small, ConvPass::grad_weight, make(600, 1, 28, 28, 32, 5, 1, 2, 1, 1),
                  DType::bf16) != conv1);
  CHECK(launch_of(ConvKernel::wgrad_small, ConvPass::grad_weight, make(300, 8, 64, 64, 4, 3, 1, 1, 1, 1), DType::f32));
  // 16-bit operands run on tensor cores where a warp's 16 x 8 tiles of dw^T are at most 16, its
  // warps taking the k steps in turn; or where a run of the tap tiles is, the warps splitting
  // them: the speedrun's conv2 (216 taps for 32 channels, 14 x 4 tiles, 2 x 4 a warp) and 196
  // taps for 9 channels (13 x 2). Not 1 tap for 136 channels (17 tiles, which no warp splits).
  std::vector<std::string> split;
  for (DType t : {DType::bf16, DType::f16}) {
    const auto conv1 =
        launch_of(ConvKernel::wgrad_small, ConvPass::grad_weight, make(256, 1, 28, 28, 24, 5, 1, 0, 1, 1), t);
    REQUIRE(conv1);
    CHECK(std::get<kernels::SmallWgradPlan>(conv1->plan).mma);
    CHECK_FALSE(std::get<kernels::SmallWgradPlan>(conv1->plan).split_taps);
    CHECK(source_of(ConvKernel::wgrad_small, ConvPass::grad_weight, make(256, 1, 28, 28, 24, 5, 1, 0, 1, 1), t)
              .find("mma.sync.aligned.m16n8k16") != std::string::npos);
    for (const ConvGeometry& g : {make(256, 24, 12, 12, 32, 3, 1, 0, 1, 1), make(6, 4, 12, 12, 9, 7, 1, 0, 1, 1)}) {
      const auto l = launch_of(ConvKernel::wgrad_small, ConvPass::grad_weight, g, t);
      REQUIRE(l);
      CHECK(std::get<kernels::SmallWgradPlan>(l->plan).mma);
      CHECK(std::get<kernels::SmallWgradPlan>(l->plan).split_taps);
      split.push_back(source_of(ConvKernel::wgrad_small, ConvPass::grad_weight, g, t));
    }
    const auto wide =
        launch_of(ConvKernel::wgrad_small, ConvPass::grad_weight, make(4, 1, 8, 8, 136, 1, 1, 0, 1, 1), t);
    REQUIRE(wide);
    CHECK_FALSE(std::get<kernels::SmallWgradPlan>(wide->plan).mma);
  }
  CHECK(check_compiles("check_conv_wgrad_small_split", split, "kiln_conv_wgrad_small", "mma.sync.aligned.m16n8k16") ==
        4);
  // The CUDA-core kernel takes at most 256 kernel rows: not the speedrun's conv2 in exact f32.
  CHECK_FALSE(launch_of(ConvKernel::wgrad_small, ConvPass::grad_weight, make(256, 24, 12, 12, 32, 3, 1, 0, 1, 1),
                        DType::f32, false));
  CHECK_FALSE(std::get<kernels::SmallWgradPlan>(launch_of(ConvKernel::wgrad_small, ConvPass::grad_weight,
                                                          make(256, 1, 28, 28, 24, 5, 1, 0, 1, 1), DType::f32, false)
                                                    ->plan)
                  .mma);
  // Over 256 kernel rows, or grouped: the tensor-core kernels take them.
  CHECK_FALSE(launch_of(ConvKernel::wgrad_small, ConvPass::grad_weight, make(4, 3, 8, 8, 128, 3, 1, 1, 1, 1), DType::bf16));
  CHECK_FALSE(launch_of(ConvKernel::wgrad_small, ConvPass::grad_weight, make(3, 6, 9, 7, 4, 3, 2, 1, 2, 2), DType::bf16));
}

TEST_CASE("direct kernels compile for stride-1 convs over few channels, and decline the rest") {
  const ConvGeometry conv1 = make(128, 1, 28, 28, 32, 5, 1, 2, 1, 1), speedrun1 = make(256, 1, 28, 28, 24, 5, 1, 0, 1, 1);
  // bf16 and f16 forwards on tensor cores, where the weights' tiles fit a thread (two k steps of
  // taps, three and four tiles of channels here); f32, and input gradients over 24 or 32
  // channels of 25 taps each, on the CUDA cores.
  const std::vector<std::string> mma = sources_for(ConvKernel::direct, {ConvPass::forward}, {conv1, speedrun1});
  const std::vector<std::string> ffma = sources_for(ConvKernel::direct, {ConvPass::grad_input}, {conv1, speedrun1});
  CHECK(check_compiles("check_conv_direct_mma", {mma.begin(), mma.begin() + 4}, "kiln_conv_direct",
                       "mma.sync.aligned.m16n8k16") == 4);
  CHECK(check_compiles("check_conv_direct", ffma, "kiln_conv_direct", "fma.rn.f32") == 6);
  CHECK(check_compiles("check_conv_direct", {mma.begin() + 4, mma.end()}, "kiln_conv_direct", "fma.rn.f32") == 2);
  CHECK(
      std::get<kernels::DirectPlan>(launch_of(ConvKernel::direct, ConvPass::forward, speedrun1, DType::f16)->plan).mma);
  CHECK_FALSE(
      std::get<kernels::DirectPlan>(launch_of(ConvKernel::direct, ConvPass::forward, speedrun1, DType::f32)->plan).mma);
  // Forwards that also sum their output's channels for a batch norm (ConvOperands::totals): a
  // block's partials (its warps' sums in shuffles), which the batch norm adds up. An input
  // gradient takes none.
  std::vector<std::string> with_totals;
  for (DType t : {DType::bf16, DType::f32})
    for (const ConvGeometry& s : {conv1, speedrun1}) {
      const auto l = launch_of(ConvKernel::direct, ConvPass::forward, s, t);
      REQUIRE(l);
      const auto w = kernels::with_totals(*l, kH100);
      REQUIRE(w);
      CHECK(kernels::stats_floats(*l) == 0);
      const auto& p = std::get<kernels::DirectPlan>(w->plan);
      // The blocks' partials in f32, a column a block.
      const std::int64_t blocks = s.n * p.bands;
      CHECK(kernels::stats_floats(*w) == 2 * s.o * blocks);
      // Each thread's sums and squares of its channels; on tensor cores each warp's.
      const std::int64_t sums = p.mma ? 8 * 2 * ((s.o + 7) / 8 * 8) * 4 : 2 * p.ot * p.threads * 4;
      CHECK(p.smem == std::get<kernels::DirectPlan>(l->plan).smem + sums);
      with_totals.push_back(kernels::source(*w));
    }
  CHECK(check_compiles("check_conv_direct_totals", with_totals, "kiln_conv_direct", "shfl.sync.bfly") == 4);
  CHECK_FALSE(kernels::with_totals(*launch_of(ConvKernel::direct, ConvPass::grad_input, conv1, DType::bf16), kH100));
  // Exact f32 too: its FMAs are f32's. There, up to 256 products per output (the speedrun's
  // conv2: 24 channels of 3x3), where the tensor cores would sum three products each.
  CHECK(launch_of(ConvKernel::direct, ConvPass::forward, conv1, DType::f32, false));
  const ConvGeometry speedrun2 = make(256, 24, 12, 12, 32, 3, 1, 0, 1, 1);
  CHECK(launch_of(ConvKernel::direct, ConvPass::forward, speedrun2, DType::f32, false));
  CHECK_FALSE(launch_of(ConvKernel::direct, ConvPass::forward, speedrun2, DType::f32));  // TF32
  CHECK_FALSE(launch_of(ConvKernel::direct, ConvPass::forward, speedrun2, DType::bf16));
  // Many products per output and many outputs (conv2), strided, or grouped: not this kind's.
  CHECK_FALSE(launch_of(ConvKernel::direct, ConvPass::forward, make(128, 32, 14, 14, 64, 5, 1, 2, 1, 1), DType::bf16));
  CHECK_FALSE(launch_of(ConvKernel::direct, ConvPass::forward, make(2, 1, 9, 9, 8, 3, 2, 1, 1, 1), DType::bf16));
  CHECK_FALSE(launch_of(ConvKernel::direct, ConvPass::forward, make(2, 2, 9, 9, 2, 3, 1, 1, 1, 2), DType::bf16));
  CHECK_FALSE(launch_of(ConvKernel::direct, ConvPass::grad_weight, conv1, DType::bf16));
}

TEST_CASE("no generated convolution for f64; f32 takes TF32 tensor cores, or exact FFMA with TF32 off") {
  const ConvGeometry s = make(2, 3, 8, 8, 4, 3, 1, 1, 1, 1);
  CHECK_FALSE(kernels::conv_math(DType::f64, DType::f64, DType::f64, true));
  CHECK_FALSE(kernels::conv_math(DType::bf16, DType::f32, DType::f32, true));  // mixed dtypes
  CHECK(kernels::conv_math(DType::f32, DType::f32, DType::f32, false) == ConvMath::f32);
  const std::string exact = source_of(ConvKernel::igemm, ConvPass::forward, s, DType::f32, false);
  CHECK(exact.find("kiln_conv_ffma") != std::string::npos);
  CHECK(exact.find("mma.sync") == std::string::npos);
  CHECK(source_of(ConvKernel::igemm, ConvPass::forward, s, DType::f32).find("kiln_conv_igemm") != std::string::npos);
}

TEST_CASE("narrow exact-f32 products are left to im2col + cuBLAS; tensor-core ones are not") {
  const ConvGeometry conv1 = make(128, 1, 28, 28, 32, 5, 1, 2, 1, 1);
  for (ConvPass pass : {ConvPass::grad_input, ConvPass::grad_weight}) {
    CAPTURE(kernels::pass_name(pass));
    const auto exact = launch_of(ConvKernel::igemm, pass, conv1, DType::f32, false);
    REQUIRE(exact);
    CHECK(kernels::slower_than_fallback(*exact));
    CHECK_FALSE(kernels::slower_than_fallback(*launch_of(ConvKernel::igemm, pass, conv1, DType::f32)));
  }
  CHECK_FALSE(kernels::slower_than_fallback(*launch_of(ConvKernel::igemm, ConvPass::forward, conv1, DType::f32, false)));
}

// Every alternative of kind k's heuristic launch, planned with its tile; none is the heuristic's.
std::vector<std::string> alternative_sources(ConvKernel k, ConvPass pass, const ConvGeometry& s, DType t, bool tf32) {
  std::vector<std::string> out;
  const auto h = launch_of(k, pass, s, t, tf32);
  if (!h) return out;
  for (ConvTile tile : kernels::alternatives(*h, kH100)) {
    out.push_back(source_of(k, pass, s, t, tf32, tile));
    CHECK(out.back() != kernels::source(*h));
  }
  return out;
}

TEST_CASE("the tuner's tile alternatives compile for the MNIST cnn's and the speedrun's convs") {
  const ConvGeometry shapes[] = {make(128, 1, 28, 28, 32, 5, 1, 2, 1, 1), make(128, 32, 14, 14, 64, 5, 1, 2, 1, 1),
                                 make(256, 24, 12, 12, 32, 3, 1, 0, 1, 1), make(1024, 32, 14, 14, 64, 5, 1, 2, 1, 1)};
  std::vector<std::string> igemm, patch;
  for (const ConvGeometry& s : shapes)
    for (DType t : {DType::bf16, DType::f32})
      for (int pass = 0; pass < 3; ++pass) {
        const auto p = static_cast<ConvPass>(pass);
        for (std::string& src : alternative_sources(ConvKernel::igemm, p, s, t, true)) igemm.push_back(std::move(src));
        for (std::string& src : alternative_sources(ConvKernel::patch, p, s, t, true)) patch.push_back(std::move(src));
      }
  const std::size_t alternatives = igemm.size() + patch.size();
  CHECK(alternatives > 20);  // the tuner has real choices on these shapes
  for (const std::string& src : igemm) REQUIRE_FALSE(src.empty());
  for (const std::string& src : patch) REQUIRE_FALSE(src.empty());
  const int compiled = check_compiles("check_conv_igemm", igemm, "kiln_conv_igemm", "kiln_conv_igemm") +
                       check_compiles("check_conv_patch", patch, "kiln_conv_patch", "kiln_conv_patch");
  CHECK(compiled == static_cast<int>(alternatives));
}

TEST_CASE("exact-f32 FFMA convolutions compile for every pass and their tile alternatives") {
  const ConvGeometry shapes[] = {make(128, 1, 28, 28, 32, 5, 1, 2, 1, 1), make(128, 32, 14, 14, 64, 5, 1, 2, 1, 1),
                                 make(256, 24, 12, 12, 32, 3, 1, 0, 1, 1), make(3, 6, 9, 7, 10, 3, 2, 1, 2, 2)};
  std::vector<std::string> sources;
  for (const ConvGeometry& s : shapes)
    for (int pass = 0; pass < 3; ++pass) {
      const auto p = static_cast<ConvPass>(pass);
      sources.push_back(source_of(ConvKernel::igemm, p, s, DType::f32, false));
      for (std::string& src : alternative_sources(ConvKernel::igemm, p, s, DType::f32, false))
        sources.push_back(std::move(src));
    }
  for (const std::string& src : sources) REQUIRE(src.find("kiln_conv_ffma") != std::string::npos);
  CHECK(sources.size() >= 12);
  CHECK(check_compiles("check_conv_ffma", sources, "kiln_conv_ffma", "kiln_conv_ffma") == static_cast<int>(sources.size()));
}
