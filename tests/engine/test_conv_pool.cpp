// conv2d, max_pool2d and avg_pool2d on the CPU: hand-computed cases, random configs
// against loops over an explicitly padded copy (written here, unlike the op's own
// bounds checks), validation errors, and gradient checks in f64.
#include <doctest/doctest.h>

#include "error_message.h"

#include <cmath>
#include <limits>
#include <string>

#include "core/registry.h"
#include "gradcheck.h"
#include "kiln/kiln.h"
#include "test_values.h"

using namespace kiln;

namespace {
using kiln_test::random_f64;
using kiln_test::check_close;
using kiln_test::message_of;



// x (N,C,H,W) surrounded by `ph`/`pw` rows and columns of `fill`.
std::vector<double> padded(const Tensor& x, std::int64_t ph, std::int64_t pw, double fill) {
  const Shape& s = x.shape();
  const std::int64_t H = s[2] + 2 * ph, W = s[3] + 2 * pw;
  std::vector<double> v = x.to_vector<double>(), out(static_cast<std::size_t>(s[0] * s[1] * H * W), fill);
  for (std::int64_t p = 0; p < s[0] * s[1]; ++p)
    for (std::int64_t i = 0; i < s[2]; ++i)
      for (std::int64_t j = 0; j < s[3]; ++j) out[(p * H + i + ph) * W + j + pw] = v[(p * s[2] + i) * s[3] + j];
  return out;
}

struct Conv {
  std::int64_t sh, sw, ph, pw, dh, dw, groups;
};

std::vector<double> ref_conv(const Tensor& x, const Tensor& w, const Conv& c, Shape& out_shape) {
  const std::int64_t N = x.shape()[0], C = x.shape()[1], O = w.shape()[0], kh = w.shape()[2], kw = w.shape()[3];
  const std::int64_t H = x.shape()[2] + 2 * c.ph, W = x.shape()[3] + 2 * c.pw;
  const std::int64_t OH = (H - c.dh * (kh - 1) - 1) / c.sh + 1, OW = (W - c.dw * (kw - 1) - 1) / c.sw + 1;
  const std::int64_t cg = C / c.groups, og = O / c.groups;
  auto xp = padded(x, c.ph, c.pw, 0.0);
  auto wv = w.to_vector<double>();
  out_shape = {N, O, OH, OW};
  std::vector<double> out;
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < O; ++o)
      for (std::int64_t y = 0; y < OH; ++y)
        for (std::int64_t z = 0; z < OW; ++z) {
          double s = 0;
          for (std::int64_t ci = 0; ci < cg; ++ci)
            for (std::int64_t i = 0; i < kh; ++i)
              for (std::int64_t j = 0; j < kw; ++j)
                s += xp[((n * C + (o / og) * cg + ci) * H + y * c.sh + i * c.dh) * W + z * c.sw + j * c.dw] *
                     wv[((o * cg + ci) * kh + i) * kw + j];
          out.push_back(s);
        }
  return out;
}


using Dims = std::vector<std::int64_t>;

}  // namespace

TEST_CASE("conv2d on a hand-computed case, with bias, stride and padding") {
  // x 1x1x3x3 = 1..9, w 1x1x2x2 = [[1,0],[0,-1]]: each output is x[i][j] - x[i+1][j+1] = -4.
  Tensor x = arange(1, 10, 1, {.dtype = DType::f32}).reshape({1, 1, 3, 3});
  Tensor w = from_vector(std::vector<float>{1, 0, 0, -1}, {1, 1, 2, 2});
  CHECK(conv2d(x, w).shape() == Shape{1, 1, 2, 2});
  CHECK(conv2d(x, w).to_vector<float>() == std::vector<float>{-4, -4, -4, -4});
  CHECK(conv2d(x, w, from_vector(std::vector<float>{0.5f})).to_vector<float>() ==
        std::vector<float>{-3.5, -3.5, -3.5, -3.5});
  // Padding 1, stride 2: windows at (-1,-1), (-1,1), (1,-1), (1,1) of the padded input.
  Tensor y = conv2d(x, w, {}, {.stride = {2}, .padding = {1}});
  CHECK(y.shape() == Shape{1, 1, 2, 2});
  CHECK(y.to_vector<float>() == std::vector<float>{-1, -3, -7, -4});
  // Two groups: each output channel sees only its own input channel.
  Tensor x2 = from_vector(std::vector<float>{1, 2, 3, 4, 10, 20, 30, 40}, {1, 2, 2, 2});
  Tensor w2 = from_vector(std::vector<float>{1, 1, 1, 1, 2, 0, 0, 0}, {2, 1, 2, 2});
  CHECK(conv2d(x2, w2, {}, {.groups = 2}).to_vector<float>() == std::vector<float>{10, 20});
}

TEST_CASE("conv2d matches loops over a padded copy for random configs") {
  struct Case {
    Shape x, w;
    Conv c;
  };
  const std::vector<Case> cases = {
      {{2, 3, 7, 6}, {4, 3, 3, 3}, {1, 1, 0, 0, 1, 1, 1}}, {{2, 3, 7, 6}, {4, 3, 3, 2}, {2, 1, 1, 2, 1, 1, 1}},
      {{1, 4, 9, 8}, {6, 2, 3, 3}, {1, 2, 2, 1, 2, 1, 2}}, {{3, 6, 5, 5}, {6, 1, 3, 3}, {1, 1, 1, 1, 1, 1, 6}},
      {{2, 2, 8, 7}, {3, 2, 1, 1}, {3, 2, 0, 0, 1, 1, 1}}, {{1, 4, 6, 6}, {4, 2, 2, 3}, {2, 2, 1, 1, 2, 2, 2}},
      {{2, 1, 5, 4}, {2, 1, 5, 4}, {1, 1, 0, 0, 1, 1, 1}}};
  std::uint64_t seed = 7;
  for (const auto& k : cases) {
    Tensor x = random_f64(k.x, seed++), w = random_f64(k.w, seed++);
    Conv2dOptions o{
        .stride = {k.c.sh, k.c.sw}, .padding = {k.c.ph, k.c.pw}, .dilation = {k.c.dh, k.c.dw}, .groups = k.c.groups};
    Shape want_shape;
    auto want = ref_conv(x, w, k.c, want_shape);
    INFO("x=" << shape_str(k.x) << " w=" << shape_str(k.w));
    Tensor y = conv2d(x, w, {}, o);
    CHECK(y.shape() == want_shape);
    check_close(y.to_vector<double>(), want, 1e-12);
    for (auto [dt, tol] : {std::pair{DType::f32, 1e-5}, {DType::f16, 2e-2}, {DType::bf16, 8e-2}})
      check_close(conv2d(x.to(dt), w.to(dt), {}, o).to(DType::f64).to_vector<double>(), want, tol);
  }
}

TEST_CASE("conv2d validates shapes and attributes") {
  Tensor x = zeros({1, 4, 5, 5});
  CHECK(message_of<ShapeError>([&] {
          conv2d(x, zeros({4, 4, 3, 3}), {}, {.groups = 3});
        }).starts_with("[conv2d] input channels 4 of input (1,4,5,5) are not divisible by groups = 3"));
  CHECK_THROWS_AS(conv2d(x, zeros({3, 2, 3, 3}), {}, {.groups = 2}), ShapeError);  // 3 outputs, 2 groups
  CHECK_THROWS_AS(conv2d(x, zeros({4, 3, 3, 3})), ShapeError);                     // C/groups mismatch
  CHECK(message_of<ShapeError>([&] {
          conv2d(x, zeros({2, 4, 6, 3}));
        }).find("larger than the padded input") != std::string::npos);
  CHECK_NOTHROW(conv2d(x, zeros({2, 4, 6, 3}), {}, {.padding = {1}}));
  CHECK_THROWS_AS(conv2d(x, zeros({2, 4, 3, 3}), {}, {.dilation = {3}}), ShapeError);
  CHECK_THROWS_AS(conv2d(zeros({4, 5, 5}), zeros({2, 4, 3, 3})), ShapeError);
  CHECK_THROWS_AS(conv2d(x, zeros({2, 4, 3, 3}), {}, {.stride = {0}}), ValueError);
  CHECK_THROWS_AS(conv2d(x, zeros({2, 4, 3, 3}), {}, {.padding = {-1}}), ValueError);
  CHECK_THROWS_AS(conv2d(x, zeros({2, 4, 3, 3}), zeros({3})), ShapeError);
  CHECK_THROWS_AS(conv2d(ones({1, 4, 5, 5}, {.dtype = DType::i32}), ones({2, 4, 3, 3}, {.dtype = DType::i32})),
                  DTypeError);
}

TEST_CASE("max_pool2d and avg_pool2d on hand-computed cases") {
  Tensor x = arange(1, 17, 1, {.dtype = DType::f32}).reshape({1, 1, 4, 4});
  CHECK(max_pool2d(x, {2}).to_vector<float>() == std::vector<float>{6, 8, 14, 16});
  CHECK(avg_pool2d(x, {2}).to_vector<float>() == std::vector<float>{3.5, 5.5, 11.5, 13.5});
  // Padding 1, stride 2, kernel 3: windows clipped at the edges.
  CHECK(max_pool2d(x, {3}, {2}, {1}).to_vector<float>() == std::vector<float>{6, 8, 14, 16});
  // count_include_pad: the corner window holds 1,2,5,6 and five zeros of padding.
  CHECK(avg_pool2d(x, {3}, {2}, {1}).to_vector<float>()[0] == doctest::Approx(14.0 / 9));
  CHECK(avg_pool2d(x, {3}, {2}, {1}, false).to_vector<float>()[0] == doctest::Approx(14.0 / 4));
  // Dilation 2: the window {1,3,9,11} shifted by the stride of 1.
  CHECK(max_pool2d(x, {2}, {1}, {0}, {2}).to_vector<float>() == std::vector<float>{11, 12, 15, 16});
  // Rectangular window, with a NaN winning its window.
  std::vector<float> v(16, 0);
  v[5] = std::numeric_limits<float>::quiet_NaN();
  Tensor y = max_pool2d(from_vector(v, {1, 1, 4, 4}), {2, 4}, {2});
  CHECK(y.shape() == Shape{1, 1, 2, 1});
  CHECK(std::isnan(y.to_vector<float>()[0]));
  CHECK(y.to_vector<float>()[1] == 0);
}

TEST_CASE("pooling matches loops over a padded copy; max indices") {
  Tensor x = random_f64({2, 3, 7, 8}, 3);
  struct Case {
    Dims k, s, p, d;
  };
  for (const Case& c : {Case{{2, 2}, {2, 2}, {0, 0}, {1, 1}}, Case{{3, 3}, {2, 1}, {1, 1}, {1, 1}},
                        Case{{3, 2}, {1, 2}, {1, 0}, {2, 1}}, Case{{2, 3}, {3, 3}, {1, 1}, {1, 1}}}) {
    const auto neg_inf = -std::numeric_limits<double>::infinity();
    auto mp = padded(x, c.p[0], c.p[1], neg_inf), zp = padded(x, c.p[0], c.p[1], 0.0);
    const std::int64_t H = 7 + 2 * c.p[0], W = 8 + 2 * c.p[1];
    const std::int64_t OH = (H - c.d[0] * (c.k[0] - 1) - 1) / c.s[0] + 1,
                       OW = (W - c.d[1] * (c.k[1] - 1) - 1) / c.s[1] + 1;
    std::vector<double> want_max, want_avg;
    for (std::int64_t pl = 0; pl < 6; ++pl)
      for (std::int64_t y = 0; y < OH; ++y)
        for (std::int64_t z = 0; z < OW; ++z) {
          double m = neg_inf, s = 0;
          for (std::int64_t i = 0; i < c.k[0]; ++i)
            for (std::int64_t j = 0; j < c.k[1]; ++j) {
              m = std::max(m, mp[(pl * H + y * c.s[0] + i * c.d[0]) * W + z * c.s[1] + j * c.d[1]]);
              s += zp[(pl * H + y * c.s[0] + i) * W + z * c.s[1] + j];
            }
          want_max.push_back(m);
          want_avg.push_back(s / static_cast<double>(c.k[0] * c.k[1]));
        }
    INFO("kernel " << c.k[0] << "x" << c.k[1]);
    Tensor got = max_pool2d(x, c.k, c.s, c.p, c.d);
    CHECK(got.shape() == Shape{2, 3, OH, OW});
    check_close(got.to_vector<double>(), want_max, 0);
    if (c.d == Dims{1, 1}) check_close(avg_pool2d(x, c.k, c.s, c.p).to_vector<double>(), want_avg, 1e-12);
    // The indices name where each maximum came from, within its (h, w) plane.
    auto outs = dispatch(get_op("max_pool2d"), std::vector<Tensor>{x},
                         Attrs{{"kernel", c.k}, {"stride", c.s}, {"padding", c.p}, {"dilation", c.d}});
    auto idx = outs[1].to_vector<std::int64_t>();
    auto xv = x.to_vector<double>();
    for (std::size_t i = 0; i < idx.size(); ++i)
      REQUIRE(xv[static_cast<std::size_t>(i / static_cast<std::size_t>(OH * OW)) * 56 + idx[i]] == want_max[i]);
    for (DType dt : {DType::f32, DType::f16, DType::bf16})
      check_close(max_pool2d(x.to(dt), c.k, c.s, c.p, c.d).to(DType::f64).to_vector<double>(),
                  max_pool2d(x.to(dt).to(DType::f64), c.k, c.s, c.p, c.d).to_vector<double>(), 0);
  }
}

TEST_CASE("pooling validates its arguments") {
  Tensor x = zeros({1, 2, 5, 5});
  CHECK(message_of<ShapeError>([&] { max_pool2d(x, {3}, {1}, {2}); }).starts_with("[max_pool2d] padding (2,2)"));
  CHECK_THROWS_AS(max_pool2d(x, {6}), ShapeError);
  CHECK_THROWS_AS(avg_pool2d(zeros({2, 5, 5}), {2}), ShapeError);
  CHECK_THROWS_AS(avg_pool2d(x, {0}), ValueError);
  CHECK_THROWS_AS(max_pool2d(x, {2}, {0}), ValueError);
  CHECK_THROWS_AS(max_pool2d(x, {2, 2, 2}), ValueError);
  CHECK_THROWS_AS(max_pool2d(ones({1, 1, 2, 2}, {.dtype = DType::i64}), {2}), DTypeError);
}

TEST_CASE("conv2d and pooling gradients match finite differences") {
  using testing::gradcheck;
  struct Case {
    Shape x, w;
    Conv2dOptions o;
  };
  std::uint64_t seed = 70;
  for (const auto& k :
       {Case{{2, 2, 5, 4}, {3, 2, 3, 2}, {}}, Case{{1, 4, 5, 5}, {2, 2, 2, 3}, {{2, 1}, {1}, {1, 2}, 2}},
        Case{{2, 3, 6, 5}, {3, 1, 3, 3}, {{2}, {1, 0}, {1}, 3}}}) {
    Tensor bias = random_f64({k.w[0]}, seed++);
    auto f = [&](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], k.o); };
    auto r = gradcheck(f, {random_f64(k.x, seed++), random_f64(k.w, seed++), bias});
    CHECK_MESSAGE(r.ok, "conv2d x=" << shape_str(k.x) << ": " << r.message);
  }
  // Random normal inputs: ties inside a window have probability zero.
  Tensor x = random_f64({2, 2, 6, 5}, 90);
  for (const auto& f :
       std::vector<testing::SingleFn>{[](const std::vector<Tensor>& in) { return max_pool2d(in[0], {2}); },
                                      [](const std::vector<Tensor>& in) {
                                        return max_pool2d(in[0], {3, 2}, {2, 1}, {1, 1}, {1, 2});
                                      },
                                      [](const std::vector<Tensor>& in) { return avg_pool2d(in[0], {2}); },
                                      [](const std::vector<Tensor>& in) { return avg_pool2d(in[0], {3}, {2}, {1}); },
                                      [](const std::vector<Tensor>& in) {
                                        return avg_pool2d(in[0], {3, 2}, {1, 2}, {1, 0}, false);
                                      }}) {
    auto r = gradcheck(f, {x});
    CHECK_MESSAGE(r.ok, r.message);
  }
  for (const char* op : {"conv2d", "max_pool2d", "avg_pool2d"}) {
    auto failures = testing::gradcheck_op(get_op(op));
    CHECK_MESSAGE(failures.empty(), op << ": " << (failures.empty() ? "" : failures[0]));
  }
}
