#include "kiln/dtype.h"

#include "kiln/error.h"

namespace kiln {

namespace {
struct Info {
  std::string_view name, storage, compute;
  std::size_t size;
};
// Indexed by DType.
constexpr Info kInfo[kNumDTypes] = {
    {"f32", "float", "float", 4},
    {"f64", "double", "double", 8},
    {"f16", "__half", "float", 2},
    {"bf16", "__nv_bfloat16", "float", 2},
    {"i32", "int", "int", 4},
    {"i64", "long long", "long long", 8},
    {"u8", "unsigned char", "unsigned int", 1},
    {"bool", "bool", "bool", 1},
};
const Info& info(DType t) { return kInfo[static_cast<int>(t)]; }
}  // namespace

std::string_view dtype_name(DType t) { return info(t).name; }
std::size_t dtype_size(DType t) { return info(t).size; }
std::string_view cuda_storage_type(DType t) { return info(t).storage; }
std::string_view cuda_compute_type(DType t) { return info(t).compute; }
bool is_floating(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16; }
bool is_integral(DType t) { return t == DType::i32 || t == DType::i64 || t == DType::u8; }

std::optional<DType> parse_dtype(std::string_view name) {
  for (DType t : kAllDTypes)
    if (dtype_name(t) == name) return t;
  return std::nullopt;
}

DTypes::DTypes(std::initializer_list<DType> list) {
  if (list.size() > kMax) throw DTypeError("[dtypes] at most 4 dtypes in a kernel key");
  for (DType t : list) v[n++] = t;
}

std::string DTypes::str() const {
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (i) s += ',';
    s += dtype_name(v[i]);
  }
  return s;
}

DTypes DTypes::parse(std::string_view text) {
  DTypes d;
  while (!text.empty()) {
    auto comma = text.find(',');
    auto part = text.substr(0, comma);
    auto t = parse_dtype(part);
    if (!t) throw DTypeError("[dtypes] unknown dtype '" + std::string(part) + "' (known: f32 f64 f16 bf16 i32 i64 u8 bool)");
    if (d.n == kMax) throw DTypeError("[dtypes] at most 4 dtypes in a kernel key");
    d.v[d.n++] = *t;
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
  }
  return d;
}

bool DTypes::operator==(const DTypes& o) const {
  if (n != o.n) return false;
  for (int i = 0; i < n; ++i)
    if (v[i] != o.v[i]) return false;
  return true;
}

}  // namespace kiln
