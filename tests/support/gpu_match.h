#pragma once
// GPU tests: a GPU tensor against its CPU reference, elementwise within a tolerance.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace kiln_test {

inline const kiln::Device kGpu = kiln::Device::cuda(0);

// A tensor's values as the bit patterns of f32 (or f64) numbers, for bit-for-bit comparisons.
inline std::vector<std::uint32_t> f32_bits(const kiln::Tensor& t) {
  const std::vector<float> v = t.to(kiln::Device::cpu()).to(kiln::DType::f32).to_vector<float>();
  std::vector<std::uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}
// A 16-bit tensor's (f16, bf16) raw bits.
inline std::vector<std::uint16_t> half_bits(const kiln::Tensor& t) {
  const kiln::Tensor h = t.to(kiln::Device::cpu()).contiguous();
  std::vector<std::uint16_t> b(static_cast<std::size_t>(h.numel()));
  std::memcpy(b.data(), h.data_ptr(), b.size() * sizeof(std::uint16_t));
  return b;
}
// Every NaN reads as one pattern: its sign and payload follow the instruction that made it (a
// fused kernel's erf or fma, the CPU's conversions), which no engine keeps.
inline std::vector<std::uint64_t> f64_bits(const kiln::Tensor& t) {
  const std::vector<double> v = t.to(kiln::Device::cpu()).to(kiln::DType::f64).to_vector<double>();
  std::vector<std::uint64_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(double));
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i] != v[i]) b[i] = 0x7ff8000000000000ULL;
  return b;
}

// Same shape and dtype; |gpu - cpu| <= tol * (1 + |cpu|) everywhere and NaNs in the same
// places; reports the first mismatch with its flat index.
inline void check_match(const kiln::Tensor& cpu, const kiln::Tensor& gpu, double tol, const std::string& name) {
  CAPTURE(name);
  REQUIRE(gpu.device().is_cuda());
  REQUIRE(cpu.dtype() == gpu.dtype());
  REQUIRE(cpu.shape() == gpu.shape());
  const std::vector<double> a = cpu.to_vector<double>(), b = gpu.to(kiln::Device::cpu()).to_vector<double>();
  for (std::size_t i = 0; i < a.size(); ++i) {
    const bool ok = std::isnan(a[i]) ? std::isnan(b[i]) : std::abs(a[i] - b[i]) <= tol * (1 + std::abs(a[i]));
    if (!ok) {
      FAIL_CHECK(name << ": first mismatch at element " << i << ": cpu " << a[i] << ", gpu " << b[i]);
      return;
    }
  }
}

}  // namespace kiln_test
