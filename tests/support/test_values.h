#pragma once
// Small tensors from literals, seeded random tensors and value checks that many suites use,
// written once (the suites build as unity translation units, where two copies would clash).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace kiln_test {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

inline kiln::Tensor f64(const std::vector<double>& v, const kiln::Shape& s) { return kiln::from_vector(v, s); }
inline kiln::Tensor f32(const std::vector<float>& v, const kiln::Shape& s) { return kiln::from_vector(v, s); }
inline kiln::Tensor i64(const std::vector<std::int64_t>& v, const kiln::Shape& s) { return kiln::from_vector(v, s); }
// An f64 leaf that requires grad.
inline kiln::Tensor leaf(const std::vector<double>& v, const kiln::Shape& s) {
  return kiln::from_vector(v, s, {.requires_grad = true});
}

// scale * N(0, 1) + shift in f64, the same values for the same seed.
inline kiln::Tensor random_f64(const kiln::Shape& s, std::uint64_t seed, double scale = 1.0, double shift = 0.0) {
  kiln::Generator g(seed);
  kiln::Tensor x = kiln::randn(s, {.dtype = kiln::DType::f64}, &g);
  if (scale != 1.0) x = kiln::mul(x, scale);
  return shift != 0.0 ? kiln::add(x, shift) : x;
}

// The largest |a - b| over the elements of two tensors of one size.
inline double max_abs_diff(const kiln::Tensor& a, const kiln::Tensor& b) {
  const std::vector<double> u = a.to_vector<double>(), v = b.to_vector<double>();
  REQUIRE(u.size() == v.size());
  double m = 0;
  for (std::size_t i = 0; i < u.size(); ++i) m = std::max(m, std::abs(u[i] - v[i]));
  return m;
}

// A tensor's elements as doubles, whatever its dtype.
inline std::vector<double> values(const kiln::Tensor& t) { return t.to(kiln::DType::f64).to_vector<double>(); }

// Every element within tol relative to the wanted value (absolute near 0); the first misses named.
inline void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::fabs(got[i] - want[i]) > tol * (1 + std::fabs(want[i]))) {
      FAIL_CHECK("element " << i << ": got " << got[i] << ", want " << want[i]);
      return;
    }
}

using Bytes = std::vector<unsigned char>;
inline void write_bytes(const std::string& path, const Bytes& b) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
inline Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

}  // namespace kiln_test
