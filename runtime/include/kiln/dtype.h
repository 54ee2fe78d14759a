#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kiln {

enum class DType : std::uint8_t { f32, f64, f16, bf16, i32, i64, u8, boolean };
inline constexpr int kNumDTypes = 8;
inline constexpr std::array<DType, kNumDTypes> kAllDTypes{DType::f32, DType::f64,  DType::f16, DType::bf16,
                                                         DType::i32, DType::i64, DType::u8,  DType::boolean};

std::string_view dtype_name(DType t);                    // "f32", ..., "bool"
std::optional<DType> parse_dtype(std::string_view name);  // inverse of dtype_name
std::size_t dtype_size(DType t);
bool is_floating(DType t);  // f32 f64 f16 bf16
bool is_integral(DType t);  // i32 i64 u8 (not bool)
// The C++ type a kernel stores and the type it computes in (f16/bf16 compute in f32).
std::string_view cuda_storage_type(DType t);
std::string_view cuda_compute_type(DType t);

// A small fixed tuple of dtypes: the dtype part of a kernel's cache key.
struct DTypes {
  static constexpr int kMax = 4;
  std::array<DType, kMax> v{};
  std::uint8_t n = 0;

  DTypes() = default;
  DTypes(std::initializer_list<DType> list);
  DType operator[](int i) const { return v[static_cast<std::size_t>(i)]; }
  int size() const { return n; }
  std::string str() const;  // "f32,f16"
  static DTypes parse(std::string_view text);  // throws DTypeError
  bool operator==(const DTypes& o) const;
};

}  // namespace kiln
