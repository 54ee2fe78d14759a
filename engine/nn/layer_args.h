#pragma once
// Argument checks and printing shared by the layer sources: window sizes, strides and
// paddings take one value (both dims) or two (height, width), as the functional ops do.
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/error.h"

namespace kiln::nn::detail {

// `v` as two values, each >= min_value; ValueError naming the layer and argument otherwise.
inline std::vector<std::int64_t> pair_arg(const std::string& layer, const char* what, const std::vector<std::int64_t>& v,
                                          std::int64_t min_value) {
  if (v.size() != 1 && v.size() != 2)
    throw ValueError("[nn." + layer + "] " + what + " takes 1 or 2 values; got " + std::to_string(v.size()));
  for (std::int64_t x : v)
    if (x < min_value)
      throw ValueError("[nn." + layer + "] " + what + " must be >= " + std::to_string(min_value) + "; got " +
                       std::to_string(x));
  return v.size() == 2 ? v : std::vector<std::int64_t>{v[0], v[0]};
}

inline void positive_arg(const std::string& layer, const char* what, std::int64_t v) {
  if (v <= 0) throw ValueError("[nn." + layer + "] " + what + " must be positive; got " + std::to_string(v));
}

// "(3,3)"
inline std::string pair_str(const std::vector<std::int64_t>& v) {
  std::string s = "(";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(v[i]);
  }
  s += ')';
  return s;
}

inline const char* bool_str(bool b) { return b ? "true" : "false"; }

}  // namespace kiln::nn::detail
