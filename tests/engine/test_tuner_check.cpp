// The tuner's acceptance check (kernels::outputs_agree): a candidate's output must match the
// reference's within a share of its largest magnitude, with NaNs and infinities in the same
// places; and its choice among the times (kernels::fastest). No GPU: plain numbers.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <cstddef>
#include <vector>

#include "backend/cuda/tuner.h"
#include "kiln/error.h"

namespace {
using V = std::vector<double>;
bool outputs_agree(const V& want, const V& got, double tolerance) {
  return kiln::kernels::outputs_agree(want, got, tolerance);
}
}  // namespace

TEST_CASE("outputs_agree: within tolerance of the largest magnitude; NaN, infinity and size must match") {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const std::vector<double> want{100.0, -2.0, 0.5, 0.0};
  CHECK(outputs_agree(want, want, 0));
  CHECK(outputs_agree(want, {100.05, -2.0, 0.45, 0.04}, 1e-3));  // 0.05 <= 1e-3 * 100
  CHECK_FALSE(outputs_agree(want, {100.0, -2.0, 0.5, 0.2}, 1e-3));
  CHECK_FALSE(outputs_agree(want, {100.0, -2.0, 0.5}, 1e-3));
  CHECK_FALSE(outputs_agree(want, {100.0, -2.0, 0.5, nan}, 1e-3));
  CHECK(outputs_agree({1.0, nan}, {1.0, nan}, 1e-3));
  CHECK_FALSE(outputs_agree({1.0, nan}, {1.0, 0.0}, 1e-3));
  CHECK(outputs_agree({1.0, inf}, {1.0, inf}, 1e-3));
  CHECK_FALSE(outputs_agree({1.0, inf}, {1.0, -inf}, 1e-3));
  CHECK_FALSE(outputs_agree({1.0, 1.0}, {1.0, inf}, 1e-3));
  CHECK(outputs_agree({0.0, 0.0}, {0.0, 0.0}, 1e-3));
  CHECK_FALSE(outputs_agree({0.0, 0.0}, {0.0, 1e-300}, 1e-3));  // all-zero reference: exact zeros only
}

TEST_CASE("fastest: candidates within 25% of the surveyed fastest are timed again, and their second times decide") {
  const double inf = std::numeric_limits<double>::infinity();
  // 0 far slower; 1, 2 and 4 contenders whose second timing puts 4 first; 3 rejected.
  std::vector<double> ms{10.0, 5.2, 5.0, inf, 6.0};
  const std::vector<double> second{9.0, 4.8, 5.1, 1.0, 4.0};
  std::vector<std::size_t> timed;
  const std::size_t best = kiln::kernels::fastest(ms, [&](std::size_t i) {
    timed.push_back(i);
    return second[i];
  });
  CHECK(best == 4);
  CHECK(timed == std::vector<std::size_t>{1, 2, 4});
  CHECK(ms == std::vector<double>{10.0, 4.8, 5.1, inf, 4.0});  // a second timing replaces the survey's

  // A clear winner is not timed again.
  std::vector<double> clear{10.0, 2.0, inf, 2.6};
  timed.clear();
  CHECK(kiln::kernels::fastest(clear, [&](std::size_t i) {
          timed.push_back(i);
          return 1.0;
        }) == 1);
  CHECK(timed.empty());
  CHECK(clear == std::vector<double>{10.0, 2.0, inf, 2.6});

  std::vector<double> alone{2.0};
  CHECK(kiln::kernels::fastest(alone, [](std::size_t) { return 3.0; }) == 0);
  std::vector<double> none;
  CHECK_THROWS_AS(kiln::kernels::fastest(none, [](std::size_t) { return 1.0; }), kiln::ValueError);
}
