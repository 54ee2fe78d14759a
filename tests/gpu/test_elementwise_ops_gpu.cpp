// Elementwise op paths the generic consistency suite does not reach: where with a bool
// condition over three broadcast operands, isnan/floor on integers (fill and copy paths),
// u8 scalar comparisons, erf, and gradients of where/pow/maximum computed on the GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "gradcheck.h"
#include "kiln/kiln.h"
#include "gpu_match.h"
#include "test_values.h"

using namespace kiln;

namespace {

using kiln_test::kGpu;
using kiln_test::kNaN;

Tensor cond_of(std::vector<std::uint8_t> v, Shape s) { return from_vector(v, s).to(DType::boolean); }

// Same values (NaN matching NaN) within rtol.
void check_same(const Tensor& cpu, const Tensor& gpu, double rtol = 0) {
  REQUIRE(gpu.device() == kGpu);
  REQUIRE(cpu.dtype() == gpu.dtype());
  REQUIRE(cpu.shape() == gpu.shape());
  std::vector<double> a = cpu.to_vector<double>(), b = gpu.to_vector<double>();
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    if (std::isnan(a[i])) CHECK(std::isnan(b[i]));
    else CHECK(std::fabs(a[i] - b[i]) <= rtol * std::max(1.0, std::fabs(a[i])));
  }
}

}  // namespace

TEST_CASE("where on the GPU: every dtype, three-way broadcasting, scalars") {
  Tensor c = cond_of({1, 0, 1, 1, 0, 0, 1}, {7, 1, 1});
  for (DType t : kAllDTypes) {
    CAPTURE(dtype_name(t));
    Tensor a = arange(0, 11 * 13, 1, {.dtype = DType::f64}).reshape({11, 13}).to(t);
    Tensor b = full({13}, 3, {.dtype = DType::f64}).to(t);
    check_same(where(c, a, b), where(c.to(kGpu), a.to(kGpu), b.to(kGpu)));
    check_same(where(c, a, 0), where(c.to(kGpu), a.to(kGpu), 0));
  }
  Tensor a = randn({5, 7}, {.dtype = DType::f16});
  Tensor b = randn({7}, {.dtype = DType::f32});
  Tensor cc = cond_of({0, 1, 1, 0, 1}, {5, 1});
  Tensor w = where(cc.to(kGpu), a.to(kGpu), b.to(kGpu));
  CHECK(w.dtype() == DType::f32);
  check_same(where(cc, a, b), w);
}

TEST_CASE("integer paths on the GPU: isnan fills false, rounding copies") {
  Tensor i = from_vector(std::vector<std::int64_t>{-3, 0, 9}).to(kGpu);
  CHECK(isnan(i).to_vector<bool>() == std::vector<bool>{false, false, false});
  CHECK(floor(i).to_vector<std::int64_t>() == std::vector<std::int64_t>{-3, 0, 9});
  CHECK(round(i).dtype() == DType::i64);
  Tensor f = from_vector(std::vector<double>{kNaN, 1.5, 2.5, -0.5}, {4}, {.dtype = DType::f64}).to(kGpu);
  CHECK(isnan(f).to_vector<bool>() == std::vector<bool>{true, false, false, false});
  std::vector<double> r = round(f).to_vector<double>();
  CHECK(std::isnan(r[0]));
  CHECK(r[1] == 2);
  CHECK(r[2] == 2);
  CHECK(sign(f).to_vector<double>()[0] == 0);  // sign(NaN) = 0 on both devices
}

TEST_CASE("u8 comparisons with scalars agree with the CPU") {
  Tensor u = from_vector(std::vector<std::uint8_t>{0, 1, 128, 255});
  for (Scalar s : {Scalar(-1), Scalar(255), Scalar(1), Scalar(true), Scalar(127.5)}) {
    CAPTURE(s.str());
    check_same(eq(u, s), eq(u.to(kGpu), s));
    check_same(lt(u, s), lt(u.to(kGpu), s));
    check_same(maximum(u, s), maximum(u.to(kGpu), s));
  }
}

TEST_CASE("erf, gelu, clamp on the GPU match the CPU") {
  Tensor x = linspace(-4, 4, 101, {.dtype = DType::f32});
  check_same(erf(x), erf(x.to(kGpu)), 1e-6);
  check_same(gelu(x), gelu(x.to(kGpu)), 1e-6);
  check_same(clamp(x, 2.0, -2.0), clamp(x.to(kGpu), 2.0, -2.0));
  Tensor xi = from_vector(std::vector<std::int32_t>{-7, 0, 7});
  check_same(clamp(xi, -2, std::nullopt), clamp(xi.to(kGpu), -2, std::nullopt));
}

TEST_CASE("gradients of where, pow and maximum on the GPU") {
  Tensor a = add(rand({3, 4}, {.dtype = DType::f64}), 0.5).to(kGpu);
  Tensor b = sub(rand({4}, {.dtype = DType::f64}), 0.5).to(kGpu);
  Tensor c = cond_of({1, 0, 0, 1}, {4}).to(kGpu);
  auto r1 = kiln::testing::gradcheck([&](const auto& x) { return where(c, x[0], x[1]); }, {a, b});
  CHECK_MESSAGE(r1.ok, r1.message);
  auto r2 = kiln::testing::gradcheck([](const auto& x) { return pow(x[0], x[1]); }, {a, b});
  CHECK_MESSAGE(r2.ok, r2.message);
  auto r3 = kiln::testing::gradcheck([](const auto& x) { return maximum(x[0], x[1]); }, {a, b});
  CHECK_MESSAGE(r3.ok, r3.message);
}
