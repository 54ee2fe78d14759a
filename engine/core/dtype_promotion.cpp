#include "kiln/dtype_promotion.h"

#include "kiln/error.h"
#include "kiln/tensor.h"

namespace kiln {

namespace {
int rank(DType t) {
  switch (t) {
    case DType::boolean: return 0;
    case DType::u8: return 1;
    case DType::i32: return 2;
    case DType::i64: return 3;
    case DType::f16:
    case DType::bf16: return 4;
    case DType::f32: return 5;
    case DType::f64: return 6;
  }
  return 0;
}

int category(DType t) { return t == DType::boolean ? 0 : is_floating(t) ? 2 : 1; }

DType promote_opt(const std::optional<DType>& a, DType b) { return a ? promote_types(*a, b) : b; }

// PyTorch's combine_categories: `lower` only matters when it is of a higher category.
std::optional<DType> combine(std::optional<DType> higher, std::optional<DType> lower) {
  if (!higher) return lower;
  if (!lower) return higher;
  if (category(*higher) >= category(*lower)) return higher;
  return promote_types(*higher, *lower);
}
}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if ((a == DType::f16 && b == DType::bf16) || (a == DType::bf16 && b == DType::f16)) return DType::f32;
  return rank(a) >= rank(b) ? a : b;
}

ResultType& ResultType::add(DType t, bool zero_dim) {
  auto& slot = zero_dim ? zero_dim_ : dim_;
  slot = promote_opt(slot, t);
  return *this;
}

ResultType& ResultType::add(const Tensor& t) { return add(t.dtype(), t.dim() == 0); }

ResultType& ResultType::add(const Scalar& s) {
  scalar_ = promote_opt(scalar_, s.default_dtype());
  return *this;
}

DType ResultType::get() const {
  auto r = combine(dim_, combine(zero_dim_, scalar_));
  if (!r) throw DTypeError("[promotion] no operands to promote");
  return *r;
}

DType result_type(const Tensor& a, const Tensor& b) { return ResultType().add(a).add(b).get(); }
DType result_type(const Tensor& a, const Scalar& b) { return ResultType().add(a).add(b).get(); }
DType result_type(DType a, DType b) { return promote_types(a, b); }

}  // namespace kiln
