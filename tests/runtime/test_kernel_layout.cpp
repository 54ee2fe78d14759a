// Host side of the elementwise launchers: collapsing shapes into kernel layouts and the
// magic-number division the strided kernels use (CPU only).
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/layout.h"
#include "kiln/error.h"

using namespace kiln;
using namespace kiln::kernels;
using Shape = std::vector<std::int64_t>;

namespace {

Operand strided(std::initializer_list<std::int64_t> s) {
  Operand o;
  std::size_t i = 0;
  for (auto v : s) o.strides[i++] = v;
  return o;
}

}  // namespace

TEST_CASE("contiguous operands collapse to the contiguous layout") {
  const Shape shape{5, 7, 11};
  Operand y = strided({77, 11, 1}), x = strided({77, 11, 1});
  auto L = make_layout<2>("t", shape, {&y, &x});
  CHECK(L.n == 385);
  CHECK(L.ndim == 0);

  // Size-1 dims carry arbitrary strides and still collapse; 0-d is one contiguous element.
  Operand z = strided({1, 7, 999});
  auto one = make_layout<2>("t", Shape{5, 1, 1}, {&z, &z});
  CHECK(one.ndim == 0);
  auto scalar = make_layout<1>("t", Shape{}, {&y});
  CHECK(scalar.n == 1);
  CHECK(scalar.ndim == 0);
}

TEST_CASE("jointly contiguous dims merge; the rest stay, innermost first") {
  // y contiguous [4, 6, 10]; x is a column slice whose rows are 12 apart: dims 0 and 1
  // merge (6 * 12 == 72), dim 2 stays separate.
  const Shape shape{4, 6, 10};
  Operand y = strided({60, 10, 1}), x = strided({72, 12, 1});
  auto L = make_layout<2>("t", shape, {&y, &x});
  REQUIRE(L.ndim == 2);
  CHECK(L.size[0] == 10);
  CHECK(L.size[1] == 24);
  CHECK(L.stride[0][0] == 1);
  CHECK(L.stride[0][1] == 10);
  CHECK(L.stride[1][0] == 1);
  CHECK(L.stride[1][1] == 12);

  // A broadcast operand (stride 0) blocks merging across its broadcast dim.
  Operand b = strided({0, 1});
  Operand yc = strided({8, 1});
  auto B = make_layout<2>("t", Shape{3, 8}, {&yc, &b});
  CHECK(B.ndim == 2);
  CHECK(B.stride[1][1] == 0);

  // Transposed views stay strided.
  Operand t = strided({1, 3}), yt = strided({4, 1});
  auto T = make_layout<2>("t", Shape{3, 4}, {&yt, &t});
  CHECK(T.ndim == 2);
}

TEST_CASE("empty shapes, too many dims and negative sizes") {
  Operand y;
  CHECK(make_layout<1>("t", Shape{3, 0, 2}, {&y}).n == 0);
  const Shape nine(9, 2);
  CHECK_THROWS_WITH_AS(make_layout<1>("relu", nine, {&y}), doctest::Contains("[relu]"), ShapeError);
  CHECK_THROWS_AS(make_layout<1>("t", Shape{-1}, {&y}), ShapeError);
}

TEST_CASE("magic-number division matches integer division below 2^31") {
  std::vector<std::int64_t> divisors;
  for (std::int64_t d = 1; d <= 300; ++d) divisors.push_back(d);
  for (std::int64_t d : {1023ll, 1024ll, 1025ll, 65535ll, 65536ll, 65537ll, 1000003ll, (1ll << 30) + 7, (1ll << 31) - 1})
    divisors.push_back(d);
  std::uint64_t state = 12345;
  for (std::int64_t d : divisors) {
    std::uint32_t magic = 0, shift = 0;
    fast_divider(d, magic, shift);
    auto check = [&](std::uint32_t r) {
      const auto hi = static_cast<std::uint32_t>((std::uint64_t{r} * magic) >> 32);
      return ((hi + r) >> shift) == r / static_cast<std::uint32_t>(d);
    };
    bool ok = check(0) && check(0x7fffffffu) && check(static_cast<std::uint32_t>(d)) &&
              check(static_cast<std::uint32_t>(d - 1));
    for (int i = 0; i < 2000 && ok; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      ok = check(static_cast<std::uint32_t>(state >> 33));  // uniform below 2^31
    }
    CAPTURE(d);
    CHECK(ok);
  }
}
