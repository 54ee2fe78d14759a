#pragma once
// A Python-style number: bool, integer or floating. As an operand of a binary op it
// takes part in type promotion by category only (tensor i32 * 2 stays i32).
#include <cstdint>
#include <ostream>
#include <string>
#include <type_traits>

#include "kiln/dtype.h"

namespace kiln {

class Scalar {
 public:
  enum class Kind : unsigned char { boolean, integer, floating };

  Scalar() : Scalar(std::int64_t{0}) {}
  Scalar(bool v) : kind_(Kind::boolean), i_(v), d_(v) {}
  template <class T>
    requires(std::is_integral_v<T> && !std::is_same_v<T, bool>)
  Scalar(T v) : kind_(Kind::integer), i_(static_cast<std::int64_t>(v)), d_(static_cast<double>(v)) {}
  template <class T>
    requires std::is_floating_point_v<T>
  Scalar(T v) : kind_(Kind::floating), i_(static_cast<std::int64_t>(v == v && v < 9.2e18 && v > -9.2e18 ? v : 0)),
                d_(static_cast<double>(v)) {}

  Kind kind() const { return kind_; }
  bool is_floating() const { return kind_ == Kind::floating; }
  bool is_integer() const { return kind_ == Kind::integer; }
  bool is_bool() const { return kind_ == Kind::boolean; }
  double to_double() const { return d_; }
  std::int64_t to_int() const { return i_; }
  bool to_bool() const { return kind_ == Kind::floating ? d_ != 0.0 : i_ != 0; }
  // The dtype a lone scalar of this kind becomes: bool, i64, or the default float f32.
  DType default_dtype() const;
  std::string str() const;
  bool operator==(const Scalar& o) const { return kind_ == o.kind_ && i_ == o.i_ && (d_ == o.d_ || (d_ != d_ && o.d_ != o.d_)); }

 private:
  Kind kind_;
  std::int64_t i_;  // exact for integers and bools
  double d_;        // exact for floats
};

std::ostream& operator<<(std::ostream& os, const Scalar& s);

}  // namespace kiln
