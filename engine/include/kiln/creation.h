#pragma once
// Creating tensors: from host data, constants and ranges.
#include <cstdint>
#include <vector>

#include "half.h"
#include "tensor.h"

namespace kiln {

Tensor empty(const Shape& shape, TensorOptions options = {});  // f32 by default; contents unspecified
Tensor zeros(const Shape& shape, TensorOptions options = {});
Tensor ones(const Shape& shape, TensorOptions options = {});
// The default dtype follows the value: bool, i64 for integers, f32 for floats.
Tensor full(const Shape& shape, const Scalar& value, TensorOptions options = {});
Tensor scalar_tensor(const Scalar& value, TensorOptions options = {});  // zero-dim

// Same shape, dtype and device as `t`.
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, const Scalar& value);

// [start, end) by step. The default dtype is i64 when all three are integers, else f32.
Tensor arange(const Scalar& end, TensorOptions options = {});
Tensor arange(const Scalar& start, const Scalar& end, const Scalar& step = 1, TensorOptions options = {});
// `steps` evenly spaced values from start to end inclusive (f32 by default).
Tensor linspace(double start, double end, std::int64_t steps, TensorOptions options = {});
// n x m with ones on the diagonal (f32 by default).
Tensor eye(std::int64_t n, TensorOptions options = {});
Tensor eye(std::int64_t n, std::int64_t m, TensorOptions options = {});

// Copies `data`, laid out row-major with elements of `dtype`, into a new tensor.
Tensor from_data(const void* data, const Shape& shape, DType dtype, Device device = Device::cpu());

// Copies `values` (row-major) into a tensor of `shape` (1-d when omitted).
// The dtype defaults to T's (float -> f32, Half -> f16, ...); another dtype converts.
// T is one of float, double, std::int32_t, std::int64_t, std::uint8_t, bool, Half, BFloat16.
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions options = {});
template <class T>
Tensor from_vector(const std::vector<T>& values) {
  return from_vector(values, Shape{static_cast<std::int64_t>(values.size())});
}

}  // namespace kiln
