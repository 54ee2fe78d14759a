#pragma once
// The non-tensor arguments of one op call (axes, a scalar operand, a target shape...),
// kept by name so graph nodes can be printed, compared and replayed.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "device.h"
#include "kiln/dtype.h"
#include "kiln/error.h"
#include "scalar.h"

namespace kiln {

using AttrValue = std::variant<bool, std::int64_t, double, Scalar, DType, Device, std::vector<std::int64_t>, std::string>;

class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items) : items_(items) {}

  Attrs& set(std::string_view name, AttrValue v);
  bool has(std::string_view name) const { return find(name) != nullptr; }

  // Throws ValueError naming the attribute when it is missing or holds another type.
  template <class T>
  const T& get(std::string_view name) const {
    const AttrValue* v = find(name);
    if (!v) missing(name);
    if (const T* p = std::get_if<T>(v)) return *p;
    wrong_type(name);
  }
  template <class T>
  T get_or(std::string_view name, T fallback) const {
    const AttrValue* v = find(name);
    if (!v) return fallback;
    if (const T* p = std::get_if<T>(v)) return *p;
    wrong_type(name);
  }

  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }
  std::string str() const;  // "axes=[0, 1], keepdim=true"
  bool operator==(const Attrs& o) const = default;

 private:
  const AttrValue* find(std::string_view name) const {
    for (const auto& [k, v] : items_)
      if (k == name) return &v;
    return nullptr;
  }
  [[noreturn]] static void missing(std::string_view name);
  [[noreturn]] static void wrong_type(std::string_view name);

  std::vector<std::pair<std::string, AttrValue>> items_;
};

}  // namespace kiln
