#pragma once
// Raw data movement with no autograd: what casts, contiguous(), copy_() and the
// dispatcher's input conversions run on.
#include "kiln/tensor.h"

namespace kiln {

// dst = src broadcast to dst's shape and converted to dst's dtype; both on one device,
// any strides. dst must not overlap src.
void copy_into(const Tensor& src, const Tensor& dst);
// Every element of dst (any strides) set to `value` converted to dst's dtype.
void fill_into(const Tensor& dst, const Scalar& value);
// A new contiguous tensor of `shape` with every element `value` (outside autograd).
Tensor filled(const Shape& shape, const Scalar& value, DType dtype, Device device);
// ValueError naming `op` when `value` cannot be stored in `dtype` without overflow (a
// float's fraction may drop; NaN and inf fit floating dtypes only; anything fits bool).
void check_fits(const Scalar& value, DType dtype, std::string_view op);
// A new contiguous tensor holding t converted to `dtype`.
Tensor convert(const Tensor& t, DType dtype);
// A contiguous host copy of t (t itself when it already is one).
Tensor host_contiguous(const Tensor& t);

}  // namespace kiln
