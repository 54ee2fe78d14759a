// The tuner's acceptance check (kernels::outputs_agree): a candidate's output must match the
// reference's within a share of its largest magnitude, with NaNs and infinities in the same
// places. No GPU: plain numbers.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "backend/cuda/tuner.h"

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
