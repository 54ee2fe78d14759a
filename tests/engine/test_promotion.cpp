// Type promotion: PyTorch's table and its scalar/zero-dim rules.
#include <doctest/doctest.h>

#include "kiln/kiln.h"

using namespace kiln;

namespace {
constexpr DType b = DType::boolean, u8 = DType::u8, i32 = DType::i32, i64 = DType::i64, f16 = DType::f16,
                bf = DType::bf16, f32 = DType::f32, f64 = DType::f64;
}

TEST_CASE("promote_types matches PyTorch's table") {
  const DType order[] = {b, u8, i32, i64, f16, bf, f32, f64};
  // Rows/columns in `order`; from torch.promote_types.
  const DType expected[8][8] = {
      {b, u8, i32, i64, f16, bf, f32, f64},          {u8, u8, i32, i64, f16, bf, f32, f64},
      {i32, i32, i32, i64, f16, bf, f32, f64},       {i64, i64, i64, i64, f16, bf, f32, f64},
      {f16, f16, f16, f16, f16, f32, f32, f64},      {bf, bf, bf, bf, f32, bf, f32, f64},
      {f32, f32, f32, f32, f32, f32, f32, f64},      {f64, f64, f64, f64, f64, f64, f64, f64},
  };
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) {
      CAPTURE(dtype_name(order[i]));
      CAPTURE(dtype_name(order[j]));
      CHECK(promote_types(order[i], order[j]) == expected[i][j]);
    }
}

TEST_CASE("scalars promote by category only") {
  Tensor ti = ones({2}, {.dtype = i32});
  Tensor th = ones({2}, {.dtype = f16});
  Tensor tu = ones({2}, {.dtype = u8});
  Tensor tb = ones({2}, {.dtype = b});
  CHECK(result_type(ti, Scalar(2)) == i32);
  CHECK(result_type(ti, Scalar(2.5)) == f32);
  CHECK(result_type(th, Scalar(2.0)) == f16);
  CHECK(result_type(tu, Scalar(300)) == u8);
  CHECK(result_type(tb, Scalar(1)) == i64);
  CHECK(result_type(tb, Scalar(true)) == b);
  CHECK(result_type(tb, Scalar(0.5)) == f32);
  CHECK((ti * 2).dtype() == i32);
  CHECK((ti * 2.5).dtype() == f32);
  CHECK((th * 2.0).dtype() == f16);
  CHECK((ti / 2).dtype() == f32);  // true division
}

TEST_CASE("zero-dim tensors rank below dimensioned ones") {
  Tensor ti = ones({2}, {.dtype = i32});
  CHECK(result_type(ti, scalar_tensor(1, {.dtype = i64})) == i32);
  CHECK(result_type(ones({2}, {.dtype = u8}), scalar_tensor(1.0, {.dtype = f64})) == f64);
  CHECK(result_type(ones({2}, {.dtype = f16}), scalar_tensor(1.0, {.dtype = f64})) == f16);
  CHECK(result_type(scalar_tensor(1, {.dtype = i32}), scalar_tensor(1, {.dtype = i64})) == i64);
  CHECK(result_type(ones({2}, {.dtype = f16}), ones({2}, {.dtype = bf})) == f32);
  CHECK((ones({2}, {.dtype = f16}) + ones({2}, {.dtype = bf})).dtype() == f32);
  CHECK((ti + ones({2}, {.dtype = f64})).dtype() == f64);
}
