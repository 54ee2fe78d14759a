// The generated tensor-core convolutions (bf16, f16, TF32) against the CPU reference in
// f64, forward, input gradient and weight gradient, over strides, padding, dilation,
// groups, odd sizes, 1x1, batch 1, split-K weight gradients, the patch kernels, the small
// weight-gradient kernel, the tile engine's 1x1, convolution and weight-gradient modes and the
// MNIST cnn's shapes.
// Each element may differ by tol * sum |a||b| of its own terms (the reference run on
// |inputs|): input rounding is in that sum, so the bound holds element by element.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "conv_tf32.h"
#include "kiln/kiln.h"
#include "kiln/runtime/generated_kernels.h"
#include "kiln/runtime/tuning.h"

using namespace kiln;

namespace {

struct IgemmCase {
  std::string name;
  Shape x, w;
  Conv2dOptions o;
};

Shape out_shape(const IgemmCase& c) {
  auto at = [](const std::vector<std::int64_t>& v, int i) { return v.size() == 2 ? v[i] : v[0]; };
  Shape y{c.x[0], c.w[0], 0, 0};
  for (int d = 0; d < 2; ++d)
    y[2 + d] =
        (c.x[2 + d] + 2 * at(c.o.padding, d) - at(c.o.dilation, d) * (c.w[2 + d] - 1) - 1) / at(c.o.stride, d) + 1;
  return y;
}

// pass 0: conv2d(a = x, b = w); 1: conv2d_grad_input(a = gy, b = w); 2: conv2d_grad_weight(a = x, b = gy).
Tensor run_pass(int pass, const IgemmCase& c, const Tensor& a, const Tensor& b) {
  if (pass == 0) return conv2d(a, b, {}, c.o);
  if (pass == 1) return conv2d_grad_input(a, b, c.x, c.o);
  return conv2d_grad_weight(a, b, c.w, c.o);
}

// Worst |gpu - ref| / (sum |a||b|) over the elements, with inputs drawn in `dt` (so the
// reference sees the rounded values) and the GPU computing in `dt`.
double worst_error(int pass, const IgemmCase& c, DType dt, std::uint64_t seed) {
  Generator gen(seed);
  const Shape ya = pass == 2 ? c.x : pass == 1 ? out_shape(c) : c.x, yb = pass == 2 ? out_shape(c) : c.w;
  const Tensor a = randn(ya, {.dtype = DType::f64}, &gen).to(dt), b = randn(yb, {.dtype = DType::f64}, &gen).to(dt);
  const Tensor a64 = a.to(DType::f64), b64 = b.to(DType::f64);
  const std::vector<double> ref = run_pass(pass, c, a64, b64).to_vector<double>();
  const std::vector<double> scale = run_pass(pass, c, abs(a64), abs(b64)).to_vector<double>();
  const Device gpu = Device::cuda(0);
  const std::vector<double> got =
      run_pass(pass, c, a.to(gpu), b.to(gpu)).to(Device::cpu()).to(DType::f64).to_vector<double>();
  REQUIRE(got.size() == ref.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(got[i] - ref[i]) / (scale[i] + 1e-30);
    if (!(e <= 1e300)) return INFINITY;  // NaN or inf where the reference is finite
    worst = std::max(worst, e);
  }
  return worst;
}

const std::vector<IgemmCase>& igemm_cases() {
  static const std::vector<IgemmCase> c = {
      {"mnist-conv1 b64", {64, 1, 28, 28}, {32, 1, 5, 5}, {.padding = {2}}},
      {"mnist-conv2 b16", {16, 32, 14, 14}, {64, 32, 5, 5}, {.padding = {2}}},
      {"plain 3x3", {2, 3, 9, 8}, {4, 3, 3, 3}, {}},
      {"s2 p1 d2 g2 odd", {3, 6, 9, 7}, {4, 3, 3, 3}, {{2}, {1}, {2}, 2}},
      {"depthwise p(1,2) d2", {2, 6, 8, 9}, {6, 1, 3, 3}, {{1}, {1, 2}, {2}, 6}},
      {"1x1 batch 1, 130 outputs", {1, 5, 4, 4}, {130, 5, 1, 1}, {}},
      {"s(3,2) p(1,0) 2x4 kernel", {2, 3, 10, 11}, {5, 3, 2, 4}, {{3, 2}, {1, 0}, {1}, 1}},
      {"C=37 O=70 3x3 p1", {4, 37, 12, 12}, {70, 37, 3, 3}, {.padding = {1}}},
      // Patch kernels (stride 1, channels in 16s): 4-row bands with a partial last one, a
      // grouped dilated conv, and the input gradient's mirrored padding.
      {"patch 4-row bands", {66, 16, 7, 7}, {64, 16, 3, 3}, {.padding = {1}}},
      {"patch g2 d2 p(2,1)", {2, 32, 9, 11}, {64, 16, 3, 3}, {{1}, {2, 1}, {2}, 2}},
      {"patch 5x5 p1", {3, 16, 10, 9}, {20, 16, 5, 5}, {.padding = {1}}},
      // 24 channels each way: bf16/f16 pad the patch and the weights to 32 with zeros.
      {"patch C=24 O=24", {3, 24, 12, 12}, {24, 24, 3, 3}, {.padding = {1}}},
      // Weight-gradient tiles: a partial second channel tile (40 = 32 + 8), two of outputs.
      {"wgrad tiles C=40 O=70", {3, 40, 6, 7}, {70, 40, 3, 3}, {.padding = {1}}},
      // Small weight gradients on CUDA cores: the speedrun's conv1 (sliding rows, two lanes per
      // row, more images than SMs) and a dilated one that reads each tap.
      {"speedrun conv1 b301", {301, 1, 28, 28}, {24, 1, 5, 5}, {}},
      {"small wgrad d2 p1", {3, 2, 11, 10}, {6, 2, 3, 3}, {.padding = {1}, .dilation = {2}}},
      // 1x1 convs as batches of GEMMs on the tile engine (16-bit on sm_90): tails in channels,
      // outputs and pixels, and one image.
      {"1x1 tile engine C=64 O=40", {3, 64, 8, 8}, {40, 64, 1, 1}, {}},
      {"1x1 tile engine C=72 O=136 14x12", {2, 72, 14, 12}, {136, 72, 1, 1}, {}},
      {"1x1 tile engine one image", {1, 256, 16, 16}, {64, 256, 1, 1}, {}},
      // Other stride-1 convs in the tile engine's convolution mode (16-byte channel rows; the
      // MNIST shapes above take it too): 3x3 and 5x5 windows, a channel tail past a k tile,
      // rows that share a tile and rows wider than one, an odd output width (pairs split across
      // rows), two output tiles of channels, one image.
      {"conv mode 3x3 C=64 16x16", {2, 64, 16, 16}, {64, 64, 3, 3}, {.padding = {1}}},
      {"conv mode 5x5 p2 C=32 O=64 16x16", {3, 32, 16, 16}, {64, 32, 5, 5}, {.padding = {2}}},
      {"conv mode 3x3 p0 C=72 O=96 10x24", {2, 72, 10, 24}, {96, 72, 3, 3}, {}},
      {"conv mode 3x3 C=16 O=136 6x40", {2, 16, 6, 40}, {136, 16, 3, 3}, {.padding = {1}}},
      {"conv mode 2x2 p0 odd width", {2, 16, 8, 8}, {24, 16, 2, 2}, {}},
      {"conv mode rows wider than a tile", {1, 8, 3, 300}, {16, 8, 3, 3}, {.padding = {1}}},
      {"conv mode one image 28x28", {1, 64, 28, 28}, {128, 64, 3, 3}, {.padding = {1}}},
      // Weight-gradient mode (the cases above take it too): rows of 7 pixels padded for TF32,
      // 24 channels padded to a tile, gy of 16 channels.
      {"wgrad mode 3x3 p1 C=24 O=16 9x7", {3, 24, 9, 7}, {16, 24, 3, 3}, {.padding = {1}}},
  };
  return c;
}

}  // namespace

TEST_CASE("tensor-core convolutions match the f64 reference in bf16, f16 and TF32") {
  const kiln_test::ConvTF32 tf32(true);
  // bf16 and f16 outputs round to 8 and 11 bits; TF32 rounds each input to 11 bits.
  const std::vector<std::pair<DType, double>> precisions{
      {DType::bf16, 8e-3}, {DType::f16, 1.5e-3}, {DType::f32, 1.5e-3}};
  for (const auto& c : igemm_cases())
    for (const auto& p : precisions)
      for (int pass = 0; pass < 3; ++pass) {
        const std::string what = c.name + " " + std::string(dtype_name(p.first)) + " pass " + std::to_string(pass);
        CAPTURE(what);
        const double e = worst_error(pass, c, p.first, 7 + pass);
        CHECK(e <= p.second);
      }
}

// Exact f32: FFMA implicit GEMMs, the small weight-gradient kernel's FMAs (few kernel rows), or
// the tile engine's convolution and weight-gradient modes summing three TF32 products of split
// operands (stride 1, 16 or more channels each way).
// TF32 alone would miss this bound by a hundredfold.
TEST_CASE("f32 convolutions with TF32 off keep f32's precision") {
  const kiln_test::ConvTF32 tf32(false);
  for (const auto& c : igemm_cases())
    for (int pass = 0; pass < 3; ++pass) {
      const std::string what = c.name + " pass " + std::to_string(pass);
      CAPTURE(what);
      CHECK(worst_error(pass, c, DType::f32, 11) <= 1e-5);
    }
}

TEST_CASE("split-K weight gradients are bit-identical from run to run") {
  const IgemmCase& c = igemm_cases()[1];
  Generator gen(3);
  const Device gpu = Device::cuda(0);
  for (auto [dt, tf32_on] : {std::pair{DType::bf16, true}, {DType::f32, true}, {DType::f32, false}}) {
    const kiln_test::ConvTF32 tf32(tf32_on);
    const Tensor x = randn(c.x, {.dtype = dt, .device = gpu}, &gen),
                 gy = randn(out_shape(c), {.dtype = dt, .device = gpu}, &gen);
    const std::vector<double> first =
        conv2d_grad_weight(x, gy, c.w, c.o).to(Device::cpu()).to(DType::f64).to_vector<double>();
    for (int rep = 0; rep < 3; ++rep)
      CHECK(conv2d_grad_weight(x, gy, c.w, c.o).to(Device::cpu()).to(DType::f64).to_vector<double>() == first);
  }
}

TEST_CASE("NaN and infinity in a convolution's input reach its output") {
  const Device gpu = Device::cuda(0);
  // Exact f32 on the tile engine: an infinity stays infinite, as FFMA keeps it; in the images
  // and in the weights, over 16 channels (three staged slices) and 32 (paired slices).
  for (std::int64_t c : {16, 32}) {
    CAPTURE(c);
    const kiln_test::ConvTF32 tf32(false);
    std::vector<double> v(static_cast<std::size_t>(c) * 36, 0.5);
    v[3 * 36 + 7] = INFINITY;       // channel 3, pixel (1, 1)
    v[9 * 36 + 28] = std::nan("");  // channel 9, pixel (4, 4)
    const Tensor x = from_vector(v, {1, c, 6, 6}).to(DType::f32);
    const Tensor w = full({16, c, 3, 3}, 0.25, {.dtype = DType::f32});
    const std::vector<double> y =
        conv2d(x.to(gpu), w.to(gpu), {}, {.padding = {1}}).to(Device::cpu()).to(DType::f64).to_vector<double>();
    int infs = 0, nans = 0;
    for (double e : y) infs += std::isinf(e) && e > 0, nans += std::isnan(e);
    CHECK(nans == 16 * 9);  // every output whose window covers (4, 4)
    CHECK(infs == 16 * 9);  // (1, 1)'s windows, none of which reach (4, 4)
    // An infinite weight (output channel 2, input channel 5, the centre tap): every pixel of
    // channel 2 is +inf; the rest stay finite and exact.
    std::vector<double> wv(static_cast<std::size_t>(16 * c * 9), 0.25);
    wv[static_cast<std::size_t>((2 * c + 5) * 9 + 4)] = INFINITY;
    const Tensor x2 = full({1, c, 6, 6}, 0.5, {.dtype = DType::f32});
    const std::vector<double> y2 = conv2d(x2.to(gpu), from_vector(wv, {16, c, 3, 3}).to(DType::f32).to(gpu), {},
                                          {.padding = {1}})
                                       .to(Device::cpu())
                                       .to(DType::f64)
                                       .to_vector<double>();
    int inf2 = 0, wrong = 0;
    for (std::size_t i = 0; i < y2.size(); ++i) {
      const bool channel2 = i / 36 == 2;
      inf2 += channel2 && std::isinf(y2[i]) && y2[i] > 0;
      wrong += !channel2 && !std::isfinite(y2[i]);
    }
    CHECK(inf2 == 36);
    CHECK(wrong == 0);
  }
  for (DType dt : {DType::bf16, DType::f32}) {
    std::vector<double> v(16, 0.0);
    v[5] = std::nan("");  // (1, 1)
    const Tensor x = from_vector(v, {1, 1, 4, 4}).to(dt);
    const Tensor w = ones({2, 1, 3, 3}, {.dtype = dt});
    const std::vector<double> y =
        conv2d(x.to(gpu), w.to(gpu), {}, {.padding = {1}}).to(Device::cpu()).to(DType::f64).to_vector<double>();
    int nans = 0;
    for (double v : y) nans += std::isnan(v);
    CHECK(nans == 2 * 9);  // every output whose window covers (1, 1), in both channels
  }
}

// Every generated conv family (implicit GEMM, patch, wgrad, small wgrad) over the cases: the
// second round finds each module by its key and builds no source, with the same bits.
TEST_CASE("convolutions met again build no kernel source and give the same bits") {
  const kiln_test::ConvTF32 tf32(true);
  const Device gpu = Device::cuda(0);
  auto round = [&] {
    std::vector<std::vector<double>> out;
    Generator gen(5);
    for (const auto& c : igemm_cases()) {
      const Tensor x = randn(c.x, {.dtype = DType::bf16, .device = gpu}, &gen);
      const Tensor w = randn(c.w, {.dtype = DType::bf16, .device = gpu}, &gen);
      const Tensor gy = randn(out_shape(c), {.dtype = DType::bf16, .device = gpu}, &gen);
      const Tensor y = conv2d(x, w, {}, c.o), dx = conv2d_grad_input(gy, w, c.x, c.o);
      for (const Tensor& t : {y, dx, conv2d_grad_weight(x, gy, c.w, c.o)})
        out.push_back(t.to(Device::cpu()).to(DType::f64).to_vector<double>());
    }
    return out;
  };
  const auto first = round();
  const std::uint64_t built = rt::generated_builds();
  CHECK(round() == first);
  CHECK(rt::generated_builds() == built);
}

// A problem's candidates are planned once but bound to each call's operands: a 1x1 weight
// gradient, which the tile engine reads as stored, met again with x 2 bytes past a 16-byte
// boundary takes another kind, and met once more aligned the engine again; each call matches
// the f64 reference, and the aligned calls give the same bits.
TEST_CASE("a conv met again with an operand off a 16-byte boundary still matches the reference") {
  const kiln_test::ConvTF32 tf32(true);
  const Device gpu = Device::cuda(0);
  const IgemmCase c{"1x1 tile engine", {2, 64, 8, 8}, {40, 64, 1, 1}, {}};
  Generator gen(9);
  const Tensor gy = randn(out_shape(c), {.dtype = DType::bf16, .device = gpu}, &gen);
  const Tensor aligned = randn(c.x, {.dtype = DType::bf16, .device = gpu}, &gen);
  const Tensor buffer = randn({shape_numel(c.x) + 1}, {.dtype = DType::bf16, .device = gpu}, &gen);
  const Tensor shifted = narrow(buffer, 0, 1, shape_numel(c.x)).view(c.x);  // contiguous, one element in
  auto check = [&](const Tensor& x) {
    const Tensor x64 = x.to(Device::cpu()).to(DType::f64), gy64 = gy.to(Device::cpu()).to(DType::f64);
    const std::vector<double> ref = conv2d_grad_weight(x64, gy64, c.w, c.o).to_vector<double>();
    const std::vector<double> scale = conv2d_grad_weight(abs(x64), abs(gy64), c.w, c.o).to_vector<double>();
    const std::vector<double> got =
        conv2d_grad_weight(x, gy, c.w, c.o).to(Device::cpu()).to(DType::f64).to_vector<double>();
    REQUIRE(got.size() == ref.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(std::fabs(got[i] - ref[i]) <= 8e-3 * scale[i]);
    return got;
  };
  const std::vector<double> first = check(aligned);
  check(shifted);
  CHECK(check(aligned) == first);
}

// A conv's backward copies gy to NHWC once for its input and weight gradients, its weight
// gradient reads the forward's copy of x and its input gradient the forward's flipped reorder of
// w: its compiled step holds two copies and one reorder fewer than the same forward (of operands
// needing no gradient) with the two gradient ops called apart, and both gradients keep their bits. The speedrun's conv2
// at batch 512, with the heuristics' picks (the tile engine, NHWC copies for all three passes), not choices other tests
// stored.
TEST_CASE("a conv's input and weight gradients share one NHWC copy of gy, and the forward's of x and w") {
  struct HeuristicsOnly {
    rt::TuneMode was = rt::tune_mode();
    HeuristicsOnly() { rt::set_tune_mode(rt::TuneMode::off); }
    ~HeuristicsOnly() { rt::set_tune_mode(was); }
  } heuristics;
  Generator gen(31);
  const Device gpu = Device::cuda(0);
  const Tensor x = randn({512, 24, 12, 12}, {.dtype = DType::bf16, .device = gpu}, &gen);
  const Tensor w = randn({32, 24, 3, 3}, {.dtype = DType::bf16, .device = gpu}, &gen);
  const Tensor gy = randn({512, 32, 10, 10}, {.dtype = DType::bf16, .device = gpu}, &gen);
  const Conv2dOptions valid{};
  auto values = [](const Tensor& t) { return t.to(Device::cpu()).to(DType::f64).to_vector<double>(); };
  const std::vector<double> dx = values(conv2d_grad_input(gy, w, x.shape(), valid));
  const std::vector<double> dw = values(conv2d_grad_weight(x, gy, w.shape(), valid));
  CompiledFunction apart = compile([&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{conv2d(x, w, Tensor(), valid), conv2d_grad_input(in[0], w, x.shape(), valid),
                               conv2d_grad_weight(x, in[0], w.shape(), valid)};
  });
  CompiledFunction backward = compile([&](const std::vector<Tensor>& in) {
    Tensor xv = x.detach(), wv = w.detach();
    xv.requires_grad_(true);
    wv.requires_grad_(true);
    Tensor y = conv2d(xv, wv, Tensor(), valid);
    y.backward(in[0]);
    return std::vector<Tensor>{y.detach(), xv.grad(), wv.grad()};
  });
  for (int call = 0; call < 3; ++call) {
    CAPTURE(call);
    const std::vector<Tensor> a = apart({gy}), b = backward({gy});
    CHECK(values(a[1]) == dx);
    CHECK(values(a[2]) == dw);
    CHECK(values(b[1]) == dx);
    CHECK(values(b[2]) == dw);
  }
  auto nhwc_copies = [](const CompiledFunction& f) {
    const CompileStats stats = f.stats();  // a copy: the names below live in it
    REQUIRE(stats.kernel_names_per_graph.size() == 1);
    const auto& names = stats.kernel_names_per_graph[0];
    return names.count("kiln_nchw_to_nhwc") ? names.at("kiln_nchw_to_nhwc") : std::size_t{0};
  };
  REQUIRE(nhwc_copies(apart) == 4);  // x for the forward, gy twice and x once for the gradients
  CHECK(nhwc_copies(backward) + 2 == nhwc_copies(apart));
  // The forward's reorder of w writes the input gradient's flipped copy too.
  auto reorders = [](const CompiledFunction& f) {
    const CompileStats stats = f.stats();
    const auto& names = stats.kernel_names_per_graph.at(0);
    return names.count("kiln_conv_weights_rsc") ? names.at("kiln_conv_weights_rsc") : std::size_t{0};
  };
  REQUIRE(reorders(apart) == 2);
  CHECK(reorders(backward) == 1);
}
