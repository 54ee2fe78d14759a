#pragma once
// Type promotion for mixed-dtype ops, following PyTorch:
//   bool < u8 < i32 < i64 < f16, bf16 < f32 < f64, and f16 + bf16 -> f32.
// Operands are ranked: tensors with dims > 0, then zero-dim tensors, then Python-style
// scalars. A lower-ranked operand only changes the result when it is of a higher
// category (bool < integer < floating): i32 tensor * 2 -> i32, i32 tensor * 2.5 -> f32,
// f16 tensor * 2.0 -> f16, u8 tensor + zero-dim f64 tensor -> f64.
#include <initializer_list>
#include <optional>

#include "kiln/dtype.h"
#include "scalar.h"

namespace kiln {

class Tensor;

// The smallest dtype both a and b convert to without losing their category.
DType promote_types(DType a, DType b);

// Accumulates operands and yields the promoted dtype.
class ResultType {
 public:
  ResultType& add(const Tensor& t);
  ResultType& add(DType t, bool zero_dim = false);
  ResultType& add(const Scalar& s);
  DType get() const;  // throws DTypeError when nothing was added

 private:
  std::optional<DType> dim_, zero_dim_, scalar_;
};

DType result_type(const Tensor& a, const Tensor& b);
DType result_type(const Tensor& a, const Scalar& b);
DType result_type(DType a, DType b);

// The dtype a floating result takes when inputs are integral or bool (true division, mean).
inline constexpr DType kDefaultFloat = DType::f32;

}  // namespace kiln
