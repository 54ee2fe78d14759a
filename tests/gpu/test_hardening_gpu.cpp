// Defects found by the differential test against PyTorch, checked on the GPU: statistics
// of data whose mean dwarfs its spread, prod's gradient at edge values, cross_entropy with
// every label ignored, and in-place writes through views.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kiln/kiln.h"
#include "gpu_match.h"

using namespace kiln;

namespace {

using kiln_test::kGpu;

// f32 data of shape (4, 300) with the given mean and standard deviation near 1.
Tensor shifted(double mean, std::uint64_t seed) {
  Generator gen(seed);
  return randn({4, 300}, {}, &gen) + mean;
}

double max_relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
  return worst;
}

// NaN where the other is NaN, otherwise equal within a relative tolerance.
void check_same(const std::vector<double>& got, const std::vector<double>& want, double rel) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element ", i, ": ", got[i], " vs ", want[i]);
    if (std::isnan(want[i])) CHECK(std::isnan(got[i]));
    else if (std::isinf(want[i])) CHECK(got[i] == want[i]);
    else CHECK(std::abs(got[i] - want[i]) <= rel * std::abs(want[i]));
  }
}

}  // namespace

TEST_CASE("f32 var and std on the GPU keep their precision when the mean is 1e3 and 1e4 times the spread") {
  for (double mean : {1e3, 1e4}) {
    const Tensor x = shifted(mean, 3);
    const Tensor x64 = x.to(DType::f64);  // the same f32 values, reduced exactly enough in f64
    const Tensor g = x.to(kGpu);
    for (double correction : {0.0, 1.0}) {
      const auto want = var(x64, {1}, false, correction).to_vector<double>();
      const double e = max_relative_error(var(g, {1}, false, correction).to_vector<double>(), want);
      CHECK_MESSAGE(e < 1e-6, "mean " << mean << " var relative error " << e);
      const auto want_std = kiln::std(x64, {1}, false, correction).to_vector<double>();
      const double es = max_relative_error(kiln::std(g, {1}, false, correction).to_vector<double>(), want_std);
      CHECK_MESSAGE(es < 1e-6, "mean " << mean << " std relative error " << es);
    }
    // The same data as a column reduction (axis 0 of the transpose).
    const double et = max_relative_error(var(transpose(g, 0, 1), {0}).to_vector<double>(), var(x64, {1}).to_vector<double>());
    CHECK_MESSAGE(et < 1e-6, "mean " << mean << " transposed var relative error " << et);
  }
}

TEST_CASE("batch norm and layer norm statistics on the GPU at mean/std 1e3 and 1e4") {
  for (double mean : {1e3, 1e4}) {
    const Tensor x = reshape(shifted(mean, 5), {6, 4, 5, 10});  // (N, C, H, W): 300 values per channel
    const Tensor x64 = x.to(DType::f64);
    // momentum 1: the running variance becomes the batch's unbiased variance.
    Tensor rm = zeros({4}, {.device = kGpu}), rv = ones({4}, {.device = kGpu});
    const Tensor y = batch_norm(x.to(kGpu), rm, rv, {}, {}, true, 1.0);
    const auto want_var = var(permute(x64, {1, 0, 2, 3}).reshape({4, 300}), {1}).to_vector<double>();
    const double ev = max_relative_error(rv.to_vector<double>(), want_var);
    CHECK_MESSAGE(ev < 1e-5, "mean " << mean << " batch norm variance relative error " << ev);
    const Tensor want_y = batch_norm(x64, Tensor(), Tensor(), {}, {}, true);
    const double ey = max(abs(y.to(Device::cpu()).to(DType::f64) - want_y)).item<double>();
    CHECK_MESSAGE(ey < 2e-3 * mean / 1e3, "mean " << mean << " batch norm output error " << ey);

    const Tensor rows = shifted(mean, 9);
    const Tensor ly = layer_norm(rows.to(kGpu), {300});
    const double el = max(abs(ly.to(Device::cpu()).to(DType::f64) - layer_norm(rows.to(DType::f64), {300}))).item<double>();
    CHECK_MESSAGE(el < 2e-3 * mean / 1e3, "mean " << mean << " layer norm output error " << el);
  }
}

TEST_CASE("prod's gradient on the GPU matches the CPU at edge values") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<std::vector<double>> rows = {
      {1e38, 1e38, 0.5}, {1e30, 1e30, 1e-30}, {inf, -inf, 2}, {0, 0, nan}, {0, 3, 4}, {2, 0, 5}, {1.5, -2, 0.25}};
  for (DType t : {DType::f32, DType::f64}) {
    for (const auto& r : rows) {
      auto grad_on = [&](Device d) {
        Tensor x = from_vector<double>(r, {1, 3}).to(t).to(d).requires_grad_();
        prod(x, {1}).backward(ones({1}, {.dtype = t, .device = d}));
        return x.grad().to(Device::cpu()).to(DType::f64).to_vector<double>();
      };
      INFO("dtype ", dtype_name(t), " row ", r[0], ", ", r[1], ", ", r[2]);
      check_same(grad_on(kGpu), grad_on(Device::cpu()), 1e-6);
    }
  }
}

TEST_CASE("cross_entropy on the GPU with every label ignored gives zero gradients, with label smoothing") {
  for (double eps : {0.0, 0.1}) {
    Tensor logits = from_vector<float>({0.5f, -1, 2, 1, 0, -0.5f}, {2, 3}).to(kGpu).requires_grad_();
    Tensor labels = from_vector<std::int64_t>({-100, -100}, {2}).to(kGpu);
    Tensor loss = cross_entropy(logits, labels, Reduction::mean, eps, -100);
    loss.backward();
    CHECK(logits.grad().to_vector<float>() == std::vector<float>(6, 0.0f));
  }
}

TEST_CASE("an in-place add through a view on the GPU sends the gradient as PyTorch does") {
  Tensor x = from_vector<float>({1, 2, 3, 4}, {2, 2}).to(kGpu).requires_grad_();
  Tensor y = from_vector<float>({10, 20}, {2}).to(kGpu).requires_grad_();
  Tensor t = x.clone();
  slice(t, 0, 0, 1).add_(y);
  sum(t * t).backward();
  CHECK(y.grad().to_vector<float>() == std::vector<float>{22, 44});
  CHECK(x.grad().to_vector<float>() == std::vector<float>{22, 44, 6, 8});
  Tensor z = from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2}).to(kGpu).requires_grad_();
  Tensor u = z * 1.0f;
  slice(transpose(u, 0, 1), 0, 1, 2).fill_(0.0);  // the second column
  sum(u * u).backward();
  CHECK(z.grad().to_vector<float>() == std::vector<float>{2, 0, 6, 0, 10, 0});
}
