#pragma once
// Host side of the elementwise kernel tests: typed host buffers, test values, and the
// reference ops computed in double. Written from the op definitions (PyTorch semantics),
// not from the kernel templates, so one mistake cannot pass both sides.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/half.h"

namespace elt {

using kiln::DType;
using Bytes = std::vector<unsigned char>;

template <class T>
T raw(const Bytes& b, std::size_t i) {
  T v;
  std::memcpy(&v, b.data() + i * sizeof(T), sizeof(T));
  return v;
}
template <class T>
void put(Bytes& b, std::size_t i, T v) {
  std::memcpy(b.data() + i * sizeof(T), &v, sizeof(T));
}

inline double load(DType t, const Bytes& b, std::size_t i) {
  switch (t) {
    case DType::f32: return raw<float>(b, i);
    case DType::f64: return raw<double>(b, i);
    case DType::f16: return kiln::half_bits_to_float(raw<std::uint16_t>(b, i));
    case DType::bf16: return kiln::bf16_bits_to_float(raw<std::uint16_t>(b, i));
    case DType::i32: return raw<std::int32_t>(b, i);
    case DType::i64: return static_cast<double>(raw<std::int64_t>(b, i));
    case DType::u8: return raw<std::uint8_t>(b, i);
    case DType::boolean: return raw<std::uint8_t>(b, i) != 0;
  }
  return 0;
}

// Stores v with PyTorch's conversion rules: f16/bf16 through float, round to nearest
// even; integers truncate toward zero and wrap (u8 through i64); bool is v != 0.
inline void store(DType t, Bytes& b, std::size_t i, double v) {
  const std::int64_t as_int = std::isfinite(v) && std::fabs(v) < 9.2e18 ? static_cast<std::int64_t>(v) : 0;
  switch (t) {
    case DType::f32: put(b, i, static_cast<float>(v)); break;
    case DType::f64: put(b, i, v); break;
    case DType::f16: put(b, i, kiln::float_to_half_bits(static_cast<float>(v))); break;
    case DType::bf16: put(b, i, kiln::float_to_bf16_bits(static_cast<float>(v))); break;
    case DType::i32: put(b, i, static_cast<std::int32_t>(static_cast<std::uint32_t>(as_int))); break;
    case DType::i64: put(b, i, as_int); break;
    case DType::u8: put(b, i, static_cast<std::uint8_t>(as_int)); break;
    case DType::boolean: put(b, i, static_cast<std::uint8_t>(v != 0 ? 1 : 0)); break;
  }
}

// Per-dtype agreement: NaN matches NaN, infinities match exactly, integers and bool
// exactly, floats within rtol * |want| + atol.
inline bool agrees(DType t, double got, double want) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  if (std::isinf(want) || std::isinf(got) || !kiln::is_floating(t)) return got == want;
  double rtol = 0, atol = 0;
  switch (t) {
    case DType::f32: rtol = 1e-5, atol = 1e-6; break;
    case DType::f64: rtol = 1e-12, atol = 1e-12; break;
    case DType::f16: rtol = 1e-3, atol = 1e-5; break;
    case DType::bf16: rtol = 8e-3, atol = 1e-4; break;
    default: break;
  }
  return std::fabs(got - want) <= atol + rtol * std::fabs(want);
}

struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return s >> 11;
  }
  double uniform(double lo, double hi) { return lo + (hi - lo) * static_cast<double>(next()) / 9007199254740992.0; }
  std::int64_t integer(std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(hi - lo + 1));
  }
};

enum class Values {
  general,      // floats: specials (NaN, +-Inf, +-0, halves, 25) then uniform [-4, 4]
  int_targets,  // finite floats in [-100, 300], for casts to integer dtypes
};

// n test values of dtype t.
inline Bytes make_values(DType t, std::size_t n, Rng& rng, Values kind = Values::general) {
  static const double specials[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 0.5, -0.5, 1.5,
                                    2.5, -2.5,     1.0,       -1.0, 3.0, 25.0, -25.0};
  Bytes b(n * kiln::dtype_size(t));
  for (std::size_t i = 0; i < n; ++i) {
    double v = 0;
    if (kiln::is_floating(t)) {
      if (kind == Values::int_targets) v = rng.uniform(-100, 300);
      else v = i < std::size(specials) ? specials[i] : rng.uniform(-4, 4);
    } else if (t == DType::u8) {
      v = static_cast<double>(rng.integer(0, 255));
    } else if (t == DType::boolean) {
      v = static_cast<double>(rng.integer(0, 1));
    } else {
      v = static_cast<double>(rng.integer(-50, 50));
      // Products of these need 64 bits and stay exact in double.
      if (t == DType::i64 && i % 97 == 5) v = (i % 2 ? -1.0 : 1.0) * (67108864.0 + 3.0);
    }
    store(t, b, i, v);
  }
  return b;
}

using UnaryRef = std::function<double(double x, double p0, double p1)>;
using BinaryRef = std::function<double(double a, double b)>;

inline const std::map<std::string, UnaryRef>& unary_refs() {
  static const std::map<std::string, UnaryRef> refs{
      {"neg", [](double x, double, double) { return -x; }},
      {"abs", [](double x, double, double) { return std::fabs(x); }},
      // PyTorch: sign(NaN) = 0.
      {"sign", [](double x, double, double) { return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0; }},
      {"square", [](double x, double, double) { return x * x; }},
      {"relu", [](double x, double, double) { return std::isnan(x) ? x : std::max(x, 0.0); }},
      {"clamp", [](double x, double lo, double hi) { return std::isnan(x) ? x : std::min(std::max(x, lo), hi); }},
      {"exp", [](double x, double, double) { return std::exp(x); }},
      {"log", [](double x, double, double) { return std::log(x); }},
      {"log1p", [](double x, double, double) { return std::log1p(x); }},
      {"expm1", [](double x, double, double) { return std::expm1(x); }},
      {"sqrt", [](double x, double, double) { return std::sqrt(x); }},
      {"rsqrt", [](double x, double, double) { return 1.0 / std::sqrt(x); }},
      {"sin", [](double x, double, double) { return std::sin(x); }},
      {"cos", [](double x, double, double) { return std::cos(x); }},
      {"tanh", [](double x, double, double) { return std::tanh(x); }},
      {"erf", [](double x, double, double) { return std::erf(x); }},
      {"sigmoid", [](double x, double, double) { return 1.0 / (1.0 + std::exp(-x)); }},
      {"leaky_relu", [](double x, double slope, double) { return x > 0 ? x : x * slope; }},
      {"gelu", [](double x, double, double) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }},
      {"silu", [](double x, double, double) { return x / (1.0 + std::exp(-x)); }},
      {"softplus", [](double x, double, double) { return x > 20 ? x : std::log1p(std::exp(x)); }},
      {"floor", [](double x, double, double) { return std::floor(x); }},
      {"ceil", [](double x, double, double) { return std::ceil(x); }},
      {"round", [](double x, double, double) { return std::nearbyint(x); }},  // half to even
      {"logical_not", [](double x, double, double) { return x == 0 ? 1.0 : 0.0; }},
      {"isnan", [](double x, double, double) { return std::isnan(x) ? 1.0 : 0.0; }},
      {"cast", [](double x, double, double) { return x; }},
  };
  return refs;
}

inline const std::map<std::string, BinaryRef>& binary_refs() {
  static const std::map<std::string, BinaryRef> refs{
      {"add", [](double a, double b) { return a + b; }},
      {"sub", [](double a, double b) { return a - b; }},
      {"mul", [](double a, double b) { return a * b; }},
      {"div", [](double a, double b) { return a / b; }},
      {"pow", [](double a, double b) { return std::pow(a, b); }},
      {"maximum", [](double a, double b) { return std::isnan(a) ? a : std::isnan(b) ? b : std::max(a, b); }},
      {"relu_backward", [](double g, double y) { return y > 0 ? g : 0.0; }},
      {"minimum", [](double a, double b) { return std::isnan(a) ? a : std::isnan(b) ? b : std::min(a, b); }},
      {"eq", [](double a, double b) { return a == b ? 1.0 : 0.0; }},
      {"ne", [](double a, double b) { return a != b ? 1.0 : 0.0; }},
      {"lt", [](double a, double b) { return a < b ? 1.0 : 0.0; }},
      {"le", [](double a, double b) { return a <= b ? 1.0 : 0.0; }},
      {"gt", [](double a, double b) { return a > b ? 1.0 : 0.0; }},
      {"ge", [](double a, double b) { return a >= b ? 1.0 : 0.0; }},
      {"logical_and", [](double a, double b) { return a != 0 && b != 0 ? 1.0 : 0.0; }},
      {"logical_or", [](double a, double b) { return a != 0 || b != 0 ? 1.0 : 0.0; }},
  };
  return refs;
}

}  // namespace elt
