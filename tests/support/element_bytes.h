#pragma once
// Reads and writes element e of a raw host buffer of dtype dt, through double: the GEMM
// tests build strided operands byte by byte.
#include <cstdint>

#include "kiln/dtype.h"
#include "kiln/half.h"

namespace kiln_test {

inline double get_element(kiln::DType dt, const void* bytes, std::int64_t e) {
  using kiln::DType;
  const void* p = static_cast<const unsigned char*>(bytes) + e * static_cast<std::int64_t>(kiln::dtype_size(dt));
  switch (dt) {
    case DType::f32: return *static_cast<const float*>(p);
    case DType::f64: return *static_cast<const double*>(p);
    case DType::f16: return static_cast<float>(*static_cast<const kiln::Half*>(p));
    case DType::bf16: return static_cast<float>(*static_cast<const kiln::BFloat16*>(p));
    case DType::i32: return *static_cast<const std::int32_t*>(p);
    default: return static_cast<double>(*static_cast<const std::int64_t*>(p));
  }
}

inline void set_element(kiln::DType dt, void* bytes, std::int64_t e, double v) {
  using kiln::DType;
  void* p = static_cast<unsigned char*>(bytes) + e * static_cast<std::int64_t>(kiln::dtype_size(dt));
  switch (dt) {
    case DType::f32: *static_cast<float*>(p) = static_cast<float>(v); break;
    case DType::f64: *static_cast<double*>(p) = v; break;
    case DType::f16: *static_cast<kiln::Half*>(p) = kiln::Half(static_cast<float>(v)); break;
    case DType::bf16: *static_cast<kiln::BFloat16*>(p) = kiln::BFloat16(static_cast<float>(v)); break;
    case DType::i32: *static_cast<std::int32_t*>(p) = static_cast<std::int32_t>(v); break;
    default: *static_cast<std::int64_t*>(p) = static_cast<std::int64_t>(v); break;
  }
}

}  // namespace kiln_test
