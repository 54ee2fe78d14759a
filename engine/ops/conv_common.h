#pragma once
// Helpers shared by conv.cpp and pool.cpp: (height, width) attrs, shape text, and
// dense copies for the CPU loops and the GPU kernels (which read contiguous NCHW).
#include <array>
#include <string>
#include <vector>

#include "core/registry.h"

namespace kiln::conv_detail {

// The dtypes every conv and pool op takes.

inline std::string paren(const Shape& s) {
  std::string r = "(";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + ")";
}

// A (height, width) attr given as one value or two; ValueError below `min` or when absent
// without a fallback (fallback < 0).
inline std::array<std::int64_t, 2> pair_attr(const Attrs& attrs, const char* name, std::int64_t fallback,
                                             std::int64_t min, const std::string& op) {
  std::vector<std::int64_t> v = attrs.get_or<std::vector<std::int64_t>>(name, {});
  if (v.empty()) {
    if (fallback < 0) throw ValueError("[" + op + "] needs " + name);
    v = {fallback};
  }
  if (v.size() > 2)
    throw ValueError("[" + op + "] " + name + " takes one or two values, got " + std::to_string(v.size()));
  std::array<std::int64_t, 2> r{v[0], v.size() == 2 ? v[1] : v[0]};
  for (std::int64_t x : r)
    if (x < min)
      throw ValueError("[" + op + "] " + name + " must be >= " + std::to_string(min) + ", got " + paren(Shape(v)));
  return r;
}

// The elements of a CPU tensor, row-major, in the compute type (f32 for f16/bf16).
template <class T>
std::vector<cpu::compute_t<T>> load_dense(const Tensor& t) {
  std::vector<cpu::compute_t<T>> v(static_cast<std::size_t>(t.numel()));
  const T* p = cpu::ptr<const T>(t);
  std::size_t i = 0;
  cpu::for_each_offset<1>(t.shape(), {&t.strides()}, {0},
                          [&](const std::array<std::int64_t, 1>& o) { v[i++] = cpu::load(p[o[0]]); });
  return v;
}

}  // namespace kiln::conv_detail
