// Conv kernels launched as planned, not as the tuner picks, against the CPU convolution in f64
// of the same rounded inputs. Each element may differ by tol * sum |a||b| of its own terms.
//   - The direct kind (stride-1 forward and input gradient over few channels, on the CUDA
//     cores): one input channel with and without padding, two channels with a rectangular window
//     and unequal padding, a 7x7 input gradient to three channels; bf16, f16 and f32; and in exact
//     f32 only, 3, 24 and 10 channels of 7x7, 3x3 and 5x5 (up to 256 products per output). Each
//     case also checks which precisions the kind plans it for.
//   - The patch kind (stride-1 forward and input gradient on tensor cores), its weights staged
//     from w by each block: partial channel blocks, padded channels, groups, w not aligned.
//   - The small weight-gradient kind (few kernel rows, on the CUDA cores): bands, image groups,
//     strides and every width of gy's loads; bf16 written in bf16 or f32, exact f32.
//   - Weight gradients on the tile engine in every tile the tuner may time: 16-bit read K-major
//     through copies (GemmConv::k_major), TF32 and exact f32; rows padded to 16 bytes and not,
//     5x5 and 3x3 windows.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda/generated/conv/conv_plan.h"
#include "backend/cuda/generated/gemm/gemm_plan.h"
#include "device_buffers.h"
#include "element_bytes.h"
#include "kiln/kiln.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/memory.h"

using namespace kiln;
using kernels::ConvKernel;
using kernels::ConvPass;
using kiln_test::upload;

namespace {

// Which precisions the kind plans a pass for: exact f32 takes up to 256 products per output,
// 16-bit up to 64 (or at most 4 output channels in either).
enum class Takes { none, f32_only, all };

struct DirectCase {
  std::string name;
  Shape x, w;
  std::int64_t ph, pw;
  Takes forward, grad_input;
};

kernels::ConvGeometry geometry(const DirectCase& c) {
  const std::int64_t oh = c.x[2] + 2 * c.ph - c.w[2] + 1, ow = c.x[3] + 2 * c.pw - c.w[3] + 1;
  return {c.x[0], c.x[1], c.x[2], c.x[3], c.w[0], c.w[2], c.w[3], oh, ow, 1, 1, c.ph, c.pw, 1, 1, 1};
}

std::vector<double> download(const rt::DeviceBuffer& b, std::int64_t count, DType dt, const rt::Stream& s) {
  std::vector<unsigned char> host(static_cast<std::size_t>(count) * dtype_size(dt));
  rt::copy_to_host(host.data(), b.ptr(), host.size(), s);
  s.synchronize();
  std::vector<double> out(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = kiln_test::get_element(dt, host.data(), static_cast<std::int64_t>(i));
  return out;
}

// Worst |got - ref| / scale over the elements; infinite where got is NaN or inf.
double worst_of(const std::vector<double>& got, const std::vector<double>& ref, const std::vector<double>& scale) {
  REQUIRE(got.size() == ref.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(got[i] - ref[i]) / (scale[i] + 1e-30);
    if (!(e <= 1e300)) return INFINITY;
    worst = std::max(worst, e);
  }
  return worst;
}

// Worst |gpu - ref| / (sum |a||b|) of one pass (0 forward, 1 input gradient) in `dt`.
double worst_error(const DirectCase& c, int pass, DType dt) {
  const kernels::ConvGeometry g = geometry(c);
  const Conv2dOptions o{.padding = {c.ph, c.pw}};
  const Shape in = pass == 0 ? c.x : Shape{g.n, g.o, g.oh, g.ow};
  const Shape out = pass == 0 ? Shape{g.n, g.o, g.oh, g.ow} : c.x;
  Generator gen(17 + pass);
  const Tensor a = randn(in, {.dtype = DType::f64}, &gen).to(dt), w = randn(c.w, {.dtype = DType::f64}, &gen).to(dt);
  const Tensor a64 = a.to(DType::f64), w64 = w.to(DType::f64);
  auto reference = [&](const Tensor& x, const Tensor& k) {
    return pass == 0 ? conv2d(x, k, {}, o) : conv2d_grad_input(x, k, c.x, o);
  };
  const ConvPass p = pass == 0 ? ConvPass::forward : ConvPass::grad_input;
  const rt::DeviceInfo& info = rt::device_info(0);
  const auto math = kernels::conv_math(dt, dt, dt, false);
  REQUIRE(math);
  const auto l = kernels::plan(ConvKernel::direct, p, g, dt, *math, {info.sm_count, info.max_shared_optin});
  REQUIRE(l);
  const rt::Stream& s = rt::default_stream(0);
  const rt::DeviceBuffer da = upload(a, s), dw = upload(w, s), dy = upload(zeros(out, {.dtype = dt}), s);
  kernels::launch(*l, {da.ptr(), dw.ptr(), dy.ptr(), dt, &s});
  return worst_of(download(dy, shape_numel(out), dt, s), reference(a64, w64).to_vector<double>(),
                  reference(abs(a64), abs(w64)).to_vector<double>());
}

// The patch kind's pass (0 forward, 1 input gradient) of x (n, c, h, w) by w (o, c / groups, k, k)
// with padding `pad`, its weights read `offset` values past an allocation's start (1: not 16-byte
// aligned, so staged a value at a time): worst |gpu - ref| / (sum |a||b|), in dt (f32 as TF32).
double patch_worst(const Shape& x, const Shape& w, std::int64_t pad, std::int64_t groups, int pass, DType dt,
                   std::int64_t offset) {
  const std::int64_t oh = x[2] + 2 * pad - w[2] + 1, ow = x[3] + 2 * pad - w[3] + 1;
  const kernels::ConvGeometry g{x[0], x[1], x[2], x[3], w[0], w[2], w[3], oh, ow, 1, 1, pad, pad, 1, 1, groups};
  const Conv2dOptions o{.padding = {pad}, .groups = groups};
  const Shape y{x[0], w[0], oh, ow};
  const Shape in = pass == 0 ? x : y, out = pass == 0 ? y : x;
  Generator gen(23 + pass);
  const Tensor a = randn(in, {.dtype = DType::f64}, &gen).to(dt), k = randn(w, {.dtype = DType::f64}, &gen).to(dt);
  const Tensor a64 = a.to(DType::f64), k64 = k.to(DType::f64);
  auto reference = [&](const Tensor& p, const Tensor& q) {
    return pass == 0 ? conv2d(p, q, {}, o) : conv2d_grad_input(p, q, x, o);
  };
  const rt::DeviceInfo& info = rt::device_info(0);
  const auto math = kernels::conv_math(dt, dt, dt, true);
  REQUIRE(math);
  const auto l = kernels::plan(ConvKernel::patch, pass == 0 ? ConvPass::forward : ConvPass::grad_input, g, dt, *math,
                               {info.sm_count, info.max_shared_optin});
  REQUIRE(l);
  const rt::Stream& s = rt::default_stream(0);
  const Tensor shifted = cat({zeros({offset}, {.dtype = dt}), k.reshape({-1})}, 0);
  const rt::DeviceBuffer da = upload(a, s), dw = upload(shifted, s), dy = upload(zeros(out, {.dtype = dt}), s);
  kernels::launch(*l, {da.ptr(), dw.ptr() + offset * dtype_size(dt), dy.ptr(), dt, &s});
  return worst_of(download(dy, shape_numel(out), dt, s), reference(a64, k64).to_vector<double>(),
                  reference(abs(a64), abs(k64)).to_vector<double>());
}

// The tile engine's launch for g as planned, then every tile the tuner may time beside it.
std::vector<kernels::GemmLaunch> every_tile(const kernels::GemmGeometry& g, const kernels::GemmTarget& tgt) {
  const auto heuristic = kernels::plan(kernels::GemmKernel::wgmma, g, tgt);
  REQUIRE(heuristic);
  std::vector<kernels::GemmLaunch> launches{*heuristic};
  for (kernels::GemmTile tile : kernels::alternatives(*heuristic, tgt))
    if (const auto l = kernels::plan(kernels::GemmKernel::wgmma, g, tgt, tile)) launches.push_back(*l);
  return launches;
}

}  // namespace

TEST_CASE("direct convolutions over few channels match the f64 reference in bf16, f16 and f32") {
  const std::vector<DirectCase> cases = {
      {"mnist conv1 b4", {4, 1, 28, 28}, {32, 1, 5, 5}, 2, 2, Takes::all, Takes::all},
      {"speedrun conv1 b3", {3, 1, 28, 28}, {24, 1, 5, 5}, 0, 0, Takes::all, Takes::all},
      {"2 channels 3x4 p(1,2) 13x11", {3, 2, 13, 11}, {6, 2, 3, 4}, 1, 2, Takes::all, Takes::all},
      {"7x7 p3 40 -> 3 channels, odd width", {2, 3, 9, 13}, {40, 3, 7, 7}, 3, 3, Takes::f32_only, Takes::all},
      {"speedrun conv2 b2", {2, 24, 12, 12}, {32, 24, 3, 3}, 0, 0, Takes::f32_only, Takes::none},
      {"10 -> 10 channels 5x5 p2 9x13", {2, 10, 9, 13}, {10, 10, 5, 5}, 2, 2, Takes::f32_only, Takes::f32_only},
  };
  // bf16 and f16 outputs round to 8 and 11 bits; f32 sums exactly rounded products.
  const std::vector<std::pair<DType, double>> precisions{{DType::bf16, 8e-3}, {DType::f16, 1.5e-3}, {DType::f32, 1e-5}};
  const rt::DeviceInfo& info = rt::device_info(0);
  const kernels::ConvTarget target{info.sm_count, info.max_shared_optin};
  for (const DirectCase& c : cases)
    for (const auto& [dt, tol] : precisions)
      for (int pass = 0; pass < 2; ++pass) {
        const Takes takes = pass == 0 ? c.forward : c.grad_input;
        const bool planned = takes == Takes::all || (takes == Takes::f32_only && dt == DType::f32);
        const std::string what = c.name + " " + std::string(dtype_name(dt)) + " pass " + std::to_string(pass);
        CAPTURE(what);
        const auto math = kernels::conv_math(dt, dt, dt, false);
        REQUIRE(math);
        const ConvPass p = pass == 0 ? ConvPass::forward : ConvPass::grad_input;
        CHECK(kernels::plan(ConvKernel::direct, p, geometry(c), dt, *math, target).has_value() == planned);
        if (planned) CHECK(worst_error(c, pass, dt) <= tol);
      }
}

// Each block stages its weights from w in w's own order (no reorder kernel): channels past the
// group's in a block of 32 (the speedrun's conv2's input gradient to 24 channels), channels padded
// to the MMA's 16, groups, runs of 12 channels' taps (108 values, staged a value at a time), and w
// not 16-byte aligned.
TEST_CASE("the patch kind's forward and input gradient match the f64 reference, weights staged from w") {
  struct Case {
    std::string name;
    Shape x, w;
    std::int64_t pad, groups;
    bool forward;
  };
  const std::vector<Case> cases = {
      {"speedrun conv2 b2", {2, 24, 12, 12}, {32, 24, 3, 3}, 0, 1, true},
      {"two groups of 16 -> 24, padded", {2, 32, 10, 10}, {48, 16, 3, 3}, 1, 2, true},
      {"input gradient to 12 channels, 5x5", {2, 12, 9, 9}, {16, 12, 5, 5}, 2, 1, false},
  };
  const std::vector<std::pair<DType, double>> precisions{{DType::bf16, 8e-3}, {DType::f16, 1.5e-3}, {DType::f32, 2e-3}};
  for (const Case& c : cases)
    for (const auto& [dt, tol] : precisions)
      for (int pass = c.forward ? 0 : 1; pass < 2; ++pass)
        for (std::int64_t offset : {0, 1}) {
          const std::string what = c.name + " " + std::string(dtype_name(dt)) + " pass " + std::to_string(pass) +
                                   " offset " + std::to_string(offset);
          CAPTURE(what);
          CHECK(patch_worst(c.x, c.w, c.pad, c.groups, pass, dt, offset) <= tol);
        }
}

// The small weight-gradient kind as planned: bands of an image's rows where images are few
// (the last band shorter), several images a block where they are many, gy loaded 16, 8, 4 or 2
// bytes at a time, strided and padded; 16-bit sums written in 16 bits and in f32 (on tensor
// cores, or the CUDA cores where a warp's tiles would not fit), exact f32.
TEST_CASE("small weight gradients match the f64 reference in bands, in image groups, strided") {
  struct Case {
    std::string name;
    kernels::ConvGeometry g;  // n, c, h, w, o, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, groups
  };
  const std::vector<Case> cases = {
      {"speedrun conv1 b256", {256, 1, 28, 28, 24, 5, 5, 24, 24, 1, 1, 0, 0, 1, 1, 1}},
      {"mnist conv1 b128 p2", {128, 1, 28, 28, 32, 5, 5, 28, 28, 1, 1, 2, 2, 1, 1, 1}},
      {"2 -> 3 3x3 p1 b8", {8, 2, 16, 16, 3, 3, 3, 16, 16, 1, 1, 1, 1, 1, 1, 1}},
      {"1 -> 2 3x3 b1100", {1100, 1, 8, 8, 2, 3, 3, 6, 6, 1, 1, 0, 0, 1, 1, 1}},
      {"3 -> 5 3x3 s2 p1 10x11", {3, 3, 10, 11, 5, 3, 3, 5, 6, 2, 2, 1, 1, 1, 1, 1}},
      {"2 -> 4 3x3 odd width 7x9", {5, 2, 7, 9, 4, 3, 3, 5, 7, 1, 1, 0, 0, 1, 1, 1}},
      {"4 -> 9 7x7 b6 (196 taps)", {6, 4, 12, 12, 9, 7, 7, 6, 6, 1, 1, 0, 0, 1, 1, 1}},
      {"speedrun conv2 b256 (216 taps)", {256, 24, 12, 12, 32, 3, 3, 10, 10, 1, 1, 0, 0, 1, 1, 1}},
      {"5 -> 12 3x3 p1 b3 (45 taps)", {3, 5, 9, 9, 12, 3, 3, 9, 9, 1, 1, 1, 1, 1, 1, 1}},
  };
  const rt::DeviceInfo& info = rt::device_info(0);
  const kernels::ConvTarget target{info.sm_count, info.max_shared_optin};
  const rt::Stream& s = rt::default_stream(0);
  struct Precision {
    DType dt;
    bool f32_out;
    double tol;
  };
  // bf16 results round to 8 bits; f32 ones are f32 sums of exactly rounded products.
  for (const Precision pr :
       {Precision{DType::bf16, false, 8e-3}, Precision{DType::bf16, true, 1e-5}, Precision{DType::f16, false, 1e-3},
        Precision{DType::f16, true, 1e-5}, Precision{DType::f32, false, 1e-5}})
    for (const Case& c : cases) {
      const kernels::ConvGeometry& g = c.g;
      const std::string what = c.name + " " + std::string(dtype_name(pr.dt)) + (pr.f32_out ? " -> f32" : "");
      CAPTURE(what);
      const auto math = kernels::conv_math(pr.dt, pr.dt, pr.dt, false);
      REQUIRE(math);
      auto l = kernels::plan(ConvKernel::wgrad_small, ConvPass::grad_weight, g, pr.dt, *math, target);
      // 16-bit: on tensor cores where a warp's 16 x 8 tiles of dw^T, or its run of them where the
      // warps split 8 or more tap tiles, are at most 16. The CUDA cores take at most 256 kernel rows.
      const std::int64_t m_tiles = (g.c * g.kh * g.kw + 15) / 16, n_tiles = (g.o + 7) / 8;
      const bool split = m_tiles * n_tiles > 16 && m_tiles >= 8 && (m_tiles + 7) / 8 * n_tiles <= 16;
      const bool mma = pr.dt != DType::f32 && (m_tiles * n_tiles <= 16 || split);
      if (!mma && g.o * g.c * g.kh > 256) {
        CHECK_FALSE(l);
        continue;
      }
      REQUIRE(l);
      std::get<kernels::SmallWgradPlan>(l->plan).f32_out = pr.f32_out;
      CHECK(std::get<kernels::SmallWgradPlan>(l->plan).mma == mma);
      CHECK(std::get<kernels::SmallWgradPlan>(l->plan).split_taps == (mma && split));
      const Shape xs{g.n, g.c, g.h, g.w}, ys{g.n, g.o, g.oh, g.ow}, ws{g.o, g.c, g.kh, g.kw};
      Generator gen(23);
      const Tensor x = randn(xs, {.dtype = DType::f64}, &gen).to(pr.dt), gy = randn(ys, {.dtype = DType::f64}, &gen).to(pr.dt);
      const Tensor x64 = x.to(DType::f64), gy64 = gy.to(DType::f64);
      const Conv2dOptions o{.stride = {g.sh, g.sw}, .padding = {g.ph, g.pw}};
      const DType out = pr.f32_out ? DType::f32 : pr.dt;
      const rt::DeviceBuffer dx = upload(x, s), dgy = upload(gy, s), ddw = upload(zeros(ws, {.dtype = out}), s);
      kernels::launch(*l, {dx.ptr(), dgy.ptr(), ddw.ptr(), pr.dt, &s, pr.f32_out});
      CHECK(worst_of(download(ddw, shape_numel(ws), out, s), conv2d_grad_weight(x64, gy64, ws, o).to_vector<double>(),
                     conv2d_grad_weight(abs(x64), abs(gy64), ws, o).to_vector<double>()) <= pr.tol);
    }
}

// Every tile the tuner may time for weight-gradient mode: 16-bit read K-major, TF32 and exact f32
// (K-major always). The tuner has seen exact f32's one-tap tiles (64x32, 128x32, 64x64 T) disagree
// with its 5-tap pick on batch-1024 conv2 by over 1e-4 of the largest value; with 3 images here
// the sums are short, so a tile that misses the f32 bound is wrong, not merely drifting.
TEST_CASE("weight gradients in every tile match the f64 reference: 16-bit read K-major, TF32, exact f32") {
  const kernels::GemmTarget tgt = kernels::gemm_target(0);
  if (tgt.arch != 90) {
    MESSAGE("the tile engine needs sm_90; this GPU is sm_" << tgt.arch);
    return;
  }
  struct WgradCase {
    Shape x, w;
    std::int64_t pad;
  };
  // Rows of 14 and 7 pixels padded to 16 bytes (gy copied), rows of 16 read as stored; 24
  // channels padded to a tile.
  const std::vector<WgradCase> cases = {
      {{3, 32, 14, 14}, {64, 32, 5, 5}, 2}, {{2, 24, 9, 7}, {16, 24, 3, 3}, 1}, {{2, 16, 8, 16}, {32, 16, 3, 3}, 1}};
  const rt::Stream& s = rt::default_stream(0);
  using kernels::GemmMath;
  // Exact f32 three times: split in the kernel, through hi and lo copies (paired), and with the
  // images' copies paired and gy split in the kernel (rows of 16 only: the others are padded).
  struct Math {
    GemmMath math;
    bool paired, split_gy;
  };
  const std::vector<Math> maths{{GemmMath::bf16, false, false}, {GemmMath::f16, false, false},
                                {GemmMath::tf32, false, false}, {GemmMath::f32, false, false},
                                {GemmMath::f32, true, false},   {GemmMath::f32, true, true}};
  for (const WgradCase& c : cases)
    for (const auto& [math, paired, split_gy] : maths) {
      const DType dt = kernels::input_dtype(math);
      const std::int64_t n = c.x[0], ch = c.x[1], h = c.x[2], w = c.x[3], o = c.w[0], r = c.w[2];
      kernels::GemmConv conv;
      conv.c = ch, conv.h = h, conv.w = w, conv.r = conv.s = r, conv.pad_h = conv.pad_w = c.pad;
      conv.weight_grad = true;
      conv.k_major = !kernels::tf32_mma(math);  // TF32 and f32 read K-major as they are
      conv.paired = paired, conv.split_gy = split_gy;
      const std::int64_t oh = conv.oh(), ow = conv.ow(), taps = ch * r * r;
      kernels::GemmGeometry g{o, taps, n * oh * ow, oh * ow, h * w, taps, math};
      g.conv = conv;
      g.batch = n, g.batch_a = o * oh * ow, g.batch_b = ch * h * w;
      CHECK(kernels::wgrad_layout(g).k_major);
      if (split_gy && ow % 4 != 0) {
        CHECK_FALSE(kernels::plan(kernels::GemmKernel::wgmma, g, tgt));
        continue;
      }
      const std::vector<kernels::GemmLaunch> launches = every_tile(g, tgt);
      Generator gen(23);
      const Tensor x = randn(c.x, {.dtype = DType::f64}, &gen).to(dt);
      const Tensor gy = randn({n, o, oh, ow}, {.dtype = DType::f64}, &gen).to(dt);
      const Conv2dOptions opt{.padding = {c.pad}};
      const std::vector<double> ref = conv2d_grad_weight(x.to(DType::f64), gy.to(DType::f64), c.w, opt).to_vector<double>();
      const std::vector<double> scale =
          conv2d_grad_weight(abs(x.to(DType::f64)), abs(gy.to(DType::f64)), c.w, opt).to_vector<double>();
      const rt::DeviceBuffer dx = upload(x, s), dgy = upload(gy, s);
      for (const kernels::GemmLaunch& l : launches) {
        CAPTURE(g.text());
        CAPTURE(l.text());
        const rt::DeviceBuffer dw = upload(zeros(c.w, {.dtype = dt}), s);
        kernels::launch(l, {dgy.ptr(), dx.ptr(), dw.ptr(), 0, &s});
        // bf16 and f16 outputs round to 8 and 11 bits, TF32 inputs to 11; exact f32 keeps f32's.
        const double tol = math == GemmMath::bf16 ? 8e-3 : math == GemmMath::f32 ? 1e-5 : 1.5e-3;
        CHECK(worst_of(download(dw, shape_numel(c.w), dt, s), ref, scale) <= tol);
      }
    }
}

// Exact f32 convolution mode with paired slices ([hi | lo] staged, a stage holding both tiles of
// a k tile): every tile the tuner may time, forward and input gradient (w flipped), against f64;
// and the three-slice staging of the same geometry gives results as close.
TEST_CASE("paired f32 slices in convolution mode match the f64 reference in every tile") {
  const kernels::GemmTarget tgt = kernels::gemm_target(0);
  if (tgt.arch != 90) {
    MESSAGE("the tile engine needs sm_90; this GPU is sm_" << tgt.arch);
    return;
  }
  // conv2 of the MNIST cnn (32 -> 64, 5x5 p2) and its input gradient; 64 -> 32 3x3 p1 at 9x13.
  struct PairedCase {
    Shape x, w;
    std::int64_t pad;
    bool flip;
  };
  const std::vector<PairedCase> cases = {{{3, 32, 14, 14}, {64, 32, 5, 5}, 2, false},
                                         {{3, 64, 14, 14}, {32, 64, 5, 5}, 2, true},
                                         {{2, 64, 9, 13}, {32, 64, 3, 3}, 1, false}};
  const rt::Stream& s = rt::default_stream(0);
  for (const PairedCase& c : cases) {
    const std::int64_t n = c.x[0], ch = c.x[1], h = c.x[2], w = c.x[3], rows = c.w[0], r = c.w[2];
    kernels::GemmConv conv;
    conv.c = ch, conv.h = h, conv.w = w, conv.r = conv.s = r, conv.pad_h = conv.pad_w = c.pad, conv.flip = c.flip;
    conv.paired = true;
    const std::int64_t oh = conv.oh(), ow = conv.ow();
    kernels::GemmGeometry g{rows, oh * ow, r * r * ch, r * r * ch, h * w, oh * ow, kernels::GemmMath::f32};
    g.conv = conv;
    g.batch = n, g.batch_b = ch * h * w, g.batch_d = rows * oh * ow;
    std::vector<kernels::GemmLaunch> launches = every_tile(g, tgt);
    kernels::GemmGeometry three = g;
    three.conv->paired = false;
    const auto unpaired = kernels::plan(kernels::GemmKernel::wgmma, three, tgt);
    REQUIRE(unpaired);
    launches.push_back(*unpaired);
    CHECK(launches.size() >= 4);
    // The weights as the kernel reads them: [rows][ch][r][s], or flipped [ch][rows][r][s] with
    // the taps reversed. The reference convolves x with the weights as a forward reads them.
    Generator gen(29);
    const Tensor x = randn(c.x, {.dtype = DType::f64}, &gen).to(DType::f32);
    const Shape stored = c.flip ? Shape{ch, rows, r, r} : c.w;
    const Tensor wt = randn(stored, {.dtype = DType::f64}, &gen).to(DType::f32);
    Tensor as_forward = wt.to(DType::f64);
    if (c.flip) {
      const std::vector<double> v = as_forward.to_vector<double>();
      std::vector<double> f(v.size());
      for (std::int64_t m = 0; m < rows; ++m)
        for (std::int64_t k = 0; k < ch; ++k)
          for (std::int64_t t = 0; t < r * r; ++t)
            f[static_cast<std::size_t>((m * ch + k) * r * r + t)] = v[static_cast<std::size_t>((k * rows + m) * r * r + (r * r - 1 - t))];
      as_forward = from_vector(f, c.w, {.dtype = DType::f64});
    }
    const Conv2dOptions opt{.padding = {c.pad}};
    const std::vector<double> ref = conv2d(x.to(DType::f64), as_forward, {}, opt).to_vector<double>();
    const std::vector<double> scale = conv2d(abs(x.to(DType::f64)), abs(as_forward), {}, opt).to_vector<double>();
    const rt::DeviceBuffer dx = upload(x, s), dwt = upload(wt, s);
    const Shape out{n, rows, oh, ow};
    for (const kernels::GemmLaunch& l : launches) {
      CAPTURE(g.text());
      CAPTURE(l.text());
      const rt::DeviceBuffer dy = upload(zeros(out, {.dtype = DType::f32}), s);
      kernels::launch(l, {dwt.ptr(), dx.ptr(), dy.ptr(), 0, &s});
      CHECK(worst_of(download(dy, shape_numel(out), DType::f32, s), ref, scale) <= 1e-5);
    }
  }
}

// Exact f32 weight gradients through hi and lo copies: an infinity in the images reaches every
// tap that reads it as +inf, a NaN every tap that reads it, and the rest stay finite, in every
// tile (the copies flag them; the kernel's k tiles then take the finite pass). With gy split in
// the kernel, an infinity in gy reaches every tap of its output channel too (the split flags it).
TEST_CASE("paired f32 weight gradients carry inf and NaN from the images to the taps that read them") {
  const kernels::GemmTarget tgt = kernels::gemm_target(0);
  if (tgt.arch != 90) {
    MESSAGE("the tile engine needs sm_90; this GPU is sm_" << tgt.arch);
    return;
  }
  const std::int64_t n = 2, ch = 32, hw = 8, o = 16;
  std::vector<double> xv(static_cast<std::size_t>(n * ch * hw * hw), 0.5);
  xv[static_cast<std::size_t>((0 * ch + 5) * hw * hw + 3 * hw + 3)] = INFINITY;  // image 0, channel 5, (3, 3)
  xv[static_cast<std::size_t>((1 * ch + 9) * hw * hw)] = std::nan("");          // image 1, channel 9, (0, 0)
  const Tensor x = from_vector(xv, {n, ch, hw, hw}).to(DType::f32);
  std::vector<double> gv(static_cast<std::size_t>(n * o * hw * hw), 0.25);
  const Tensor gy = full({n, o, hw, hw}, 0.25, {.dtype = DType::f32});
  gv[static_cast<std::size_t>((1 * o + 7) * hw * hw + 4 * hw + 4)] = INFINITY;  // image 1, channel 7, (4, 4)
  const Tensor gy_inf = from_vector(gv, {n, o, hw, hw}).to(DType::f32);
  kernels::GemmConv conv;
  conv.c = ch, conv.h = conv.w = hw, conv.r = conv.s = 3, conv.pad_h = conv.pad_w = 1;
  conv.weight_grad = true, conv.paired = true;
  kernels::GemmGeometry g{o, 9 * ch, n * hw * hw, hw * hw, hw * hw, 9 * ch, kernels::GemmMath::f32};
  g.conv = conv;
  g.batch = n, g.batch_a = o * hw * hw, g.batch_b = ch * hw * hw;
  const rt::Stream& s = rt::default_stream(0);
  kernels::GemmGeometry split = g;
  split.conv->split_gy = true;
  std::vector<kernels::GemmLaunch> launches = every_tile(g, tgt), split_launches = every_tile(split, tgt);
  launches.insert(launches.end(), split_launches.begin(), split_launches.end());
  const rt::DeviceBuffer dx = upload(x, s), dgy = upload(gy, s), dgy_inf = upload(gy_inf, s);
  for (const kernels::GemmLaunch& l : launches)
    for (bool gy_has_inf : {false, true}) {
      CAPTURE(l.text());
      CAPTURE(gy_has_inf);
      const rt::DeviceBuffer dw = upload(zeros({o, ch, 3, 3}, {.dtype = DType::f32}), s);
      kernels::launch(l, {gy_has_inf ? dgy_inf.ptr() : dgy.ptr(), dx.ptr(), dw.ptr(), 0, &s});
      const std::vector<double> w = download(dw, o * ch * 9, DType::f32, s);
      int infs = 0, nans = 0, wrong = 0;
      for (std::size_t i = 0; i < w.size(); ++i) {
        const std::int64_t oc = static_cast<std::int64_t>(i / (9 * ch)), c = static_cast<std::int64_t>(i / 9) % ch;
        const std::int64_t tap = static_cast<std::int64_t>(i % 9);
        const bool reads_nan = c == 9 && tap / 3 <= 1 && tap % 3 <= 1;  // the taps some output reads (0, 0) with
        if (reads_nan) nans += std::isnan(w[i]);  // image 1's NaN meets gy's infinity too
        else if (c == 5 || (gy_has_inf && oc == 7)) infs += std::isinf(w[i]) && w[i] > 0;
        else wrong += !std::isfinite(w[i]);
      }
      // gy's infinity: output channel 7's taps of every channel but 5 (counted already) and 9's
      // four NaN taps.
      CHECK(infs == (gy_has_inf ? o * 9 + (ch - 2) * 9 + 5 : o * 9));
      CHECK(nans == o * 4);
      CHECK(wrong == 0);
    }
}
