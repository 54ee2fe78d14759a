#pragma once
// Reductions over any set of axes (negative counts from the end), keepdim or not; the
// forms without axes reduce every element to a zero-dim tensor. sum lives in kiln/ops.h.
// Integer and bool inputs: prod gives i64; mean, var, std and logsumexp give f32.
// f16/bf16 accumulate in f32. Reducing an empty dim: prod 1, mean/var/std NaN,
// logsumexp -inf; max, min, argmax and argmin throw ValueError.
#include <cstdint>
#include <vector>

#include "tensor.h"

namespace kiln {

// 0, 1, ..., a.dim()-1: every axis, for the full forms that take more arguments.
std::vector<std::int64_t> all_axes(const Tensor& a);

Tensor mean(const Tensor& a);
Tensor mean(const Tensor& a, const std::vector<std::int64_t>& axes, bool keepdim = false);
Tensor prod(const Tensor& a);
Tensor prod(const Tensor& a, const std::vector<std::int64_t>& axes, bool keepdim = false);

// NaN propagates, as in PyTorch; the dtype is kept. Gradients are split evenly among ties.
Tensor max(const Tensor& a);
Tensor max(const Tensor& a, const std::vector<std::int64_t>& axes, bool keepdim = false);
Tensor min(const Tensor& a);
Tensor min(const Tensor& a, const std::vector<std::int64_t>& axes, bool keepdim = false);

// i64 indices: of the flattened tensor (a zero-dim result), or along one axis. The first
// occurrence wins ties; NaN counts as the maximum (and the minimum). Not differentiable.
Tensor argmax(const Tensor& a);
Tensor argmax(const Tensor& a, std::int64_t axis, bool keepdim = false);
Tensor argmin(const Tensor& a);
Tensor argmin(const Tensor& a, std::int64_t axis, bool keepdim = false);

// Divides the sum of squared deviations by N - correction (1: Bessel's, as PyTorch's default).
Tensor var(const Tensor& a);
Tensor var(const Tensor& a, const std::vector<std::int64_t>& axes, bool keepdim = false, double correction = 1);
Tensor std(const Tensor& a);
Tensor std(const Tensor& a, const std::vector<std::int64_t>& axes, bool keepdim = false, double correction = 1);

// log(sum(exp(x))) computed around the maximum, so large inputs do not overflow.
Tensor logsumexp(const Tensor& a);
Tensor logsumexp(const Tensor& a, const std::vector<std::int64_t>& axes, bool keepdim = false);

}  // namespace kiln
