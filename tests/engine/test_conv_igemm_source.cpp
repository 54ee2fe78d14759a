// The generated implicit-GEMM convolution kernels compile with NVRTC for sm_80 and sm_90
// in every pass and MMA type, over the shapes their tiling treats differently (split-K,
// groups, strides, odd sizes); runs without a GPU. GPU tests check their results.
#include <doctest/doctest.h>

#include <string>

#include "ops/conv_igemm.h"
#include "kiln/conv.h"
#include "kiln/runtime/compiler.h"
#include "kiln/runtime/templates.h"
#include "compile_check.h"

using namespace kiln;
using conv_detail::ConvPass;
using conv_detail::ConvSizes;

namespace {

// n, c, h, w, o, kh, kw, stride, pad, dilation, groups; output sizes derived.
ConvSizes make(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w, std::int64_t o, std::int64_t k,
               std::int64_t st, std::int64_t pad, std::int64_t dil, std::int64_t groups) {
  const std::int64_t oh = (h + 2 * pad - dil * (k - 1) - 1) / st + 1, ow = (w + 2 * pad - dil * (k - 1) - 1) / st + 1;
  return {n, c, h, w, o, k, k, oh, ow, st, st, pad, pad, dil, dil, groups};
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
    ok += o.error.empty() && o.ptx.find(needle) != std::string::npos;
  }
  return ok;
}

}  // namespace

TEST_CASE("generated convolution kernels compile for every pass and MMA type") {
  const ConvSizes shapes[] = {
      make(128, 1, 28, 28, 32, 5, 1, 2, 1, 1),    // the MNIST cnn's conv1
      make(128, 32, 14, 14, 64, 5, 1, 2, 1, 1),   // and conv2: split-K weight gradient
      make(3, 6, 9, 7, 4, 3, 2, 1, 2, 2),         // strided, dilated, grouped, odd
      make(1, 5, 4, 4, 130, 1, 1, 0, 1, 1),       // 1x1, batch 1, many outputs
  };
  const bool tf32 = allow_conv_tf32();
  set_allow_conv_tf32(true);
  std::vector<std::string> sources;
  for (DType t : {DType::bf16, DType::f16, DType::f32})
    for (int pass = 0; pass < 3; ++pass)
      for (const ConvSizes& s : shapes) {
        const std::string src = conv_detail::conv_igemm_source(static_cast<ConvPass>(pass), s, t, 132);
        REQUIRE_FALSE(src.empty());
        // Fully instantiated: the source becomes a generated template, instantiated again.
        CHECK(rt::template_placeholders(src).empty());
        sources.push_back(src);
      }
  set_allow_conv_tf32(tf32);
  CHECK(check_compiles("check_conv_igemm", sources, "kiln_conv_igemm", "mma.sync.aligned", {80, 90}) == 3 * 3 * 4 * 2);
}

TEST_CASE("patch convolutions compile where they apply: stride 1, channels in blocks of 8") {
  const bool tf32 = allow_conv_tf32();
  set_allow_conv_tf32(true);
  const ConvSizes conv2 = make(128, 32, 14, 14, 64, 5, 1, 2, 1, 1), grouped = make(2, 32, 9, 11, 64, 3, 1, 2, 2, 2);
  const ConvSizes speedrun2 = make(256, 24, 12, 12, 32, 3, 1, 0, 1, 1);  // 24 channels: zero-padded to 32
  std::vector<std::string> sources;
  for (DType t : {DType::bf16, DType::f16, DType::f32})
    for (bool flip : {false, true})
      for (const ConvSizes& s : {conv2, grouped, speedrun2}) {
        const std::string src = conv_detail::conv_patch_source(flip, s, t, 132);
        REQUIRE_FALSE(src.empty());
        CHECK(rt::template_placeholders(src).empty());
        sources.push_back(src);
      }
  CHECK(check_compiles("check_conv_patch", sources, "kiln_conv_patch", "mma.sync.aligned") == 18);
  // Strided, or 1 input channel (the MNIST cnn's conv1), or padding wider than the kernel's
  // reach for the input gradient: the patch kernel declines, the implicit GEMM takes them.
  CHECK(conv_detail::conv_patch_source(false, make(2, 32, 9, 9, 8, 3, 2, 1, 1, 1), DType::bf16, 132).empty());
  CHECK(conv_detail::conv_patch_source(false, make(128, 1, 28, 28, 32, 5, 1, 2, 1, 1), DType::bf16, 132).empty());
  CHECK(conv_detail::conv_patch_source(true, make(2, 32, 9, 9, 16, 3, 1, 3, 1, 1), DType::bf16, 132).empty());
  set_allow_conv_tf32(tf32);
}

TEST_CASE("weight-gradient kernels compile for stride-1 convs with channels in blocks of 8") {
  const bool tf32 = allow_conv_tf32();
  set_allow_conv_tf32(true);
  std::vector<std::string> sources;
  for (DType t : {DType::bf16, DType::f16, DType::f32})
    for (const ConvSizes& s : {make(128, 32, 14, 14, 64, 5, 1, 2, 1, 1), make(3, 40, 6, 7, 70, 3, 1, 1, 1, 1),
                               make(2, 32, 9, 11, 64, 3, 1, 2, 2, 2)}) {
      const std::string src = conv_detail::conv_wgrad_source(s, t, 132);
      REQUIRE_FALSE(src.empty());
      CHECK(rt::template_placeholders(src).empty());
      sources.push_back(src);
    }
  CHECK(check_compiles("check_conv_wgrad", sources, "kiln_conv_wgrad", "mma.sync.aligned") == 9);
  CHECK(conv_detail::conv_wgrad_source(make(128, 1, 28, 28, 32, 5, 1, 2, 1, 1), DType::bf16, 132).empty());
  CHECK(conv_detail::conv_wgrad_source(make(2, 32, 9, 9, 8, 3, 2, 1, 1, 1), DType::bf16, 132).empty());
  set_allow_conv_tf32(tf32);
}

TEST_CASE("small weight-gradient kernels compile for few kernel rows, sliding or strided") {
  const bool tf32 = allow_conv_tf32();
  set_allow_conv_tf32(true);
  std::vector<std::string> sources;
  for (DType t : {DType::bf16, DType::f16, DType::f32})
    for (const ConvSizes& s : {make(256, 1, 28, 28, 24, 5, 1, 0, 1, 1), make(128, 1, 28, 28, 32, 5, 1, 2, 1, 1),
                               make(2, 3, 10, 11, 5, 3, 2, 1, 2, 1)}) {
      const std::string src = conv_detail::conv_wgrad_small_source(s, t, 132);
      REQUIRE_FALSE(src.empty());
      CHECK(rt::template_placeholders(src).empty());
      sources.push_back(src);
    }
  CHECK(check_compiles("check_conv_wgrad_small", sources, "kiln_conv_wgrad_small", "kiln_conv_wgrad_small_reduce") ==
        9);
  // Over 256 kernel rows, or grouped: the tensor-core kernels take them.
  CHECK(conv_detail::conv_wgrad_small_source(make(4, 3, 8, 8, 128, 3, 1, 1, 1, 1), DType::bf16, 132).empty());
  CHECK(conv_detail::conv_wgrad_small_source(make(3, 6, 9, 7, 4, 3, 2, 1, 2, 2), DType::bf16, 132).empty());
  set_allow_conv_tf32(tf32);
}

TEST_CASE("no generated convolution for f64; f32 takes TF32 tensor cores, or exact FFMA with TF32 off") {
  const ConvSizes s = make(2, 3, 8, 8, 4, 3, 1, 1, 1, 1);
  const bool tf32 = allow_conv_tf32();
  CHECK(conv_detail::conv_igemm_source(ConvPass::forward, s, DType::f64, 132).empty());
  set_allow_conv_tf32(false);
  const std::string exact = conv_detail::conv_igemm_source(ConvPass::forward, s, DType::f32, 132);
  CHECK(exact.find("kiln_conv_ffma") != std::string::npos);
  CHECK(exact.find("mma.sync") == std::string::npos);
  set_allow_conv_tf32(true);
  CHECK(conv_detail::conv_igemm_source(ConvPass::forward, s, DType::f32, 132).find("kiln_conv_igemm") !=
        std::string::npos);
  set_allow_conv_tf32(tf32);
}

TEST_CASE("the tuner's tile alternatives compile for the MNIST cnn's and the speedrun's convs") {
  const ConvSizes shapes[] = {make(128, 1, 28, 28, 32, 5, 1, 2, 1, 1), make(128, 32, 14, 14, 64, 5, 1, 2, 1, 1),
                              make(256, 24, 12, 12, 32, 3, 1, 0, 1, 1), make(1024, 32, 14, 14, 64, 5, 1, 2, 1, 1)};
  const bool tf32_was = allow_conv_tf32();
  set_allow_conv_tf32(true);
  std::vector<std::string> igemm, patch;
  for (const ConvSizes& s : shapes)
    for (DType t : {DType::bf16, DType::f32})
      for (int pass = 0; pass < 3; ++pass) {
        const auto p = static_cast<ConvPass>(pass);
        for (conv_detail::ConvTiles tiles : conv_detail::igemm_alternatives(p, s, t, 132)) {
          igemm.push_back(conv_detail::conv_igemm_source(p, s, t, 132, tiles));
          REQUIRE_FALSE(igemm.back().empty());
        }
        if (pass == 2) continue;
        for (int rows : conv_detail::patch_alternatives(pass == 1, s, t, 132, 227 * 1024)) {
          patch.push_back(conv_detail::conv_patch_source(pass == 1, s, t, 132, rows));
          REQUIRE_FALSE(patch.back().empty());
        }
      }
  set_allow_conv_tf32(tf32_was);
  const std::size_t alternatives = igemm.size() + patch.size();
  CHECK(alternatives > 20);  // the tuner has real choices on these shapes
  const int compiled = check_compiles("check_conv_igemm", igemm, "kiln_conv_igemm", "kiln_conv_igemm") +
                       check_compiles("check_conv_patch", patch, "kiln_conv_patch", "kiln_conv_patch");
  CHECK(compiled == static_cast<int>(alternatives));
}

TEST_CASE("exact-f32 FFMA convolutions compile for every pass and their tile alternatives") {
  const ConvSizes shapes[] = {make(128, 1, 28, 28, 32, 5, 1, 2, 1, 1), make(128, 32, 14, 14, 64, 5, 1, 2, 1, 1),
                              make(256, 24, 12, 12, 32, 3, 1, 0, 1, 1), make(3, 6, 9, 7, 10, 3, 2, 1, 2, 2)};
  const bool tf32_was = allow_conv_tf32();
  set_allow_conv_tf32(false);
  CHECK(conv_detail::igemm_kind_for(DType::f32, DType::f32, DType::f32) == conv_detail::kFfma);
  CHECK(conv_detail::igemm_kind_for(DType::f64, DType::f64, DType::f64) == -1);
  std::vector<std::string> sources;
  for (const ConvSizes& s : shapes)
    for (int pass = 0; pass < 3; ++pass) {
      const auto p = static_cast<ConvPass>(pass);
      std::vector<conv_detail::ConvTiles> tiles{{}};
      for (auto t : conv_detail::igemm_alternatives(p, s, DType::f32, 132)) tiles.push_back(t);
      for (conv_detail::ConvTiles t : tiles) {
        sources.push_back(conv_detail::conv_igemm_source(p, s, DType::f32, 132, t));
        REQUIRE(sources.back().find("kiln_conv_ffma") != std::string::npos);
      }
    }
  set_allow_conv_tf32(tf32_was);
  CHECK(sources.size() >= 12);
  CHECK(check_compiles("check_conv_ffma", sources, "kiln_conv_ffma", "kiln_conv_ffma") == static_cast<int>(sources.size()));
}
