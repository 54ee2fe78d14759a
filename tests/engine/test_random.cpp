// Philox 4x32-10 and the random creation ops on the CPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "kiln/kiln.h"

using namespace kiln;

namespace {
struct Moments {
  double mean = 0, var = 0;
};
Moments moments(const Tensor& t) {
  std::vector<double> v = t.to_vector<double>();
  Moments m;
  for (double x : v) m.mean += x;
  m.mean /= static_cast<double>(v.size());
  for (double x : v) m.var += (x - m.mean) * (x - m.mean);
  m.var /= static_cast<double>(v.size() - 1);
  return m;
}
}  // namespace

TEST_CASE("Philox4x32-10 known-answer vectors (Random123 kat_vectors)") {
  CHECK(philox4x32_10({0, 0, 0, 0}, {0, 0}) == std::array<std::uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}) ==
        std::array<std::uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}) ==
        std::array<std::uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("rand follows the documented counter scheme") {
  Generator g(0x0123456789abcdefULL);
  g.set_offset(5);
  Tensor r = rand({6}, {}, &g);
  CHECK(g.offset() == 7);  // ceil(6 / 4) blocks
  const std::array<std::uint32_t, 2> key{0x89abcdef, 0x01234567};
  auto b5 = philox4x32_10({5, 0, 0, 0}, key), b6 = philox4x32_10({6, 0, 0, 0}, key);
  std::vector<float> v = r.to_vector<float>();
  CHECK(v[0] == static_cast<float>(b5[0] >> 8) * 0x1p-24f);
  CHECK(v[3] == static_cast<float>(b5[3] >> 8) * 0x1p-24f);
  CHECK(v[5] == static_cast<float>(b6[1] >> 8) * 0x1p-24f);
  Tensor d = rand({1}, {.dtype = DType::f64}, &g);
  auto b7 = philox4x32_10({7, 0, 0, 0}, key);
  const std::uint64_t w = (static_cast<std::uint64_t>(b7[0]) << 32) | b7[1];
  CHECK(d.item<double>() == static_cast<double>(w >> 11) * 0x1p-53);
  CHECK(g.offset() == 8);
}

TEST_CASE("same seed, same numbers; the default generator advances per call") {
  manual_seed(7);
  Tensor a = randn({100});
  Tensor b = randn({100});
  manual_seed(7);
  CHECK(randn({100}).to_vector<float>() == a.to_vector<float>());
  CHECK(randn({100}).to_vector<float>() == b.to_vector<float>());
  CHECK(a.to_vector<float>() != b.to_vector<float>());
  CHECK(default_generator().offset() == 50);
  Generator g1(3), g2(3);
  CHECK(rand({33}, {.dtype = DType::bf16}, &g1).to_vector<float>() ==
        rand({33}, {.dtype = DType::bf16}, &g2).to_vector<float>());
}

TEST_CASE("rand and randn statistics") {
  Generator g(2024);
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    CAPTURE(dtype_name(dt));
    Tensor u = rand({200000}, {.dtype = dt}, &g);
    Moments mu = moments(u);
    CHECK(mu.mean == doctest::Approx(0.5).epsilon(0.01));
    CHECK(mu.var == doctest::Approx(1.0 / 12).epsilon(0.02));
    std::vector<double> v = u.to_vector<double>();
    CHECK(*std::min_element(v.begin(), v.end()) >= 0.0);
    CHECK(*std::max_element(v.begin(), v.end()) < 1.0);
    Moments mn = moments(randn({200000}, {.dtype = dt}, &g));
    CHECK(std::fabs(mn.mean) < 0.01);
    CHECK(mn.var == doctest::Approx(1.0).epsilon(0.02));
  }
}

TEST_CASE("randn tails and shape of the distribution") {
  Generator g(11);
  std::vector<double> v = randn({400000}, {.dtype = DType::f64}, &g).to_vector<double>();
  std::size_t beyond2 = 0, beyond3 = 0;
  for (double x : v) {
    beyond2 += std::fabs(x) > 2;
    beyond3 += std::fabs(x) > 3;
  }
  CHECK(static_cast<double>(beyond2) / v.size() == doctest::Approx(0.0455).epsilon(0.05));
  CHECK(static_cast<double>(beyond3) / v.size() == doctest::Approx(0.0027).epsilon(0.15));
}

TEST_CASE("randint and bernoulli") {
  Generator g(5);
  Tensor r = randint(-3, 4, {100000}, {}, &g);
  CHECK(r.dtype() == DType::i64);
  std::vector<std::int64_t> v = r.to_vector<std::int64_t>();
  std::vector<int> counts(7, 0);
  for (auto x : v) {
    REQUIRE(x >= -3);
    REQUIRE(x < 4);
    ++counts[static_cast<std::size_t>(x + 3)];
  }
  for (int c : counts) CHECK(c == doctest::Approx(100000 / 7.0).epsilon(0.05));
  Tensor big = randint(0, std::int64_t{1} << 40, {1000}, {}, &g);  // the 64-bit path
  CHECK(moments(big).mean == doctest::Approx(std::ldexp(1.0, 39)).epsilon(0.05));
  CHECK(randint(0, 10, {4}, {.dtype = DType::i32}, &g).dtype() == DType::i32);

  Tensor b = bernoulli({100000}, 0.3, {}, &g);
  CHECK(moments(b).mean == doctest::Approx(0.3).epsilon(0.02));
  Tensor p = from_vector(std::vector<float>{0, 1, 0.5f, 0, 1});
  std::vector<float> bp = bernoulli(broadcast_to(p.reshape({1, 5}), {2000, 5}).contiguous(), &g).to_vector<float>();
  double half = 0;
  for (std::size_t i = 0; i < bp.size(); i += 5) {
    CHECK(bp[i] == 0);
    CHECK(bp[i + 1] == 1);
    half += bp[i + 2];
  }
  CHECK(half / 2000 == doctest::Approx(0.5).epsilon(0.1));
  CHECK_THROWS_AS(bernoulli({2}, 1.5), ValueError);
}
