#include "kiln/attrs.h"

#include <cstdio>
#include <sstream>

namespace kiln {

DType Scalar::default_dtype() const {
  switch (kind_) {
    case Kind::boolean: return DType::boolean;
    case Kind::integer: return DType::i64;
    case Kind::floating: break;
  }
  return DType::f32;
}

std::string Scalar::str() const {
  switch (kind_) {
    case Kind::boolean: return i_ ? "true" : "false";
    case Kind::integer: return std::to_string(i_);
    case Kind::floating: break;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", d_);
  return buf;
}

std::ostream& operator<<(std::ostream& os, const Scalar& s) { return os << s.str(); }

Attrs& Attrs::set(std::string_view name, AttrValue v) {
  for (auto& [k, old] : items_) {
    if (k == name) {
      old = std::move(v);
      return *this;
    }
  }
  items_.emplace_back(std::string(name), std::move(v));
  return *this;
}

void Attrs::missing(std::string_view name) {
  throw ValueError("[attrs] missing attribute '" + std::string(name) + "'");
}

void Attrs::wrong_type(std::string_view name) {
  throw ValueError("[attrs] attribute '" + std::string(name) + "' holds another type");
}

std::string Attrs::str() const {
  std::ostringstream os;
  bool first = true;
  for (const auto& [k, v] : items_) {
    os << (first ? "" : ", ") << k << '=';
    first = false;
    std::visit(
        [&](const auto& x) {
          using X = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<X, bool>) os << (x ? "true" : "false");
          else if constexpr (std::is_same_v<X, DType>) os << dtype_name(x);
          else if constexpr (std::is_same_v<X, std::vector<std::int64_t>>) {
            os << '[';
            for (std::size_t i = 0; i < x.size(); ++i) os << (i ? ", " : "") << x[i];
            os << ']';
          } else os << x;
        },
        v);
  }
  return os.str();
}

}  // namespace kiln
