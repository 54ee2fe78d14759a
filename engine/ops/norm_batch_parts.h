#pragma once
// The stages of a training batch norm as separate ops, for a batch norm whose statistics and
// gradient sums span several processes (dist::SyncBatchNorm puts collectives between them), as
// PyTorch's batch_norm_stats / batch_norm_backward_reduce / batch_norm_backward_elemt. None
// records history. x is (N, C) or (N, C, d...); statistics are in the compute dtype (f64 for f64
// x, else f32).
#include <utility>

#include "kiln/tensor.h"

namespace kiln::batch_norm_parts {

// Per-channel mean and 1 / sqrt(biased variance + eps) of x, each (C).
std::pair<Tensor, Tensor> stats(const Tensor& x, double eps);

// (2, C): per channel sum dy' and sum dy' * xhat, xhat = (x - mean) * invstd, where dy' is g,
// or g where y > 0 when `relu` (y is then the forward's output; otherwise unused).
Tensor backward_reduce(const Tensor& g, const Tensor& x, const Tensor& y, const Tensor& mean, const Tensor& invstd,
                       bool relu);

// dx = weight * invstd * (dy' - means[0] - xhat * means[1]), with means (2, C) the sums above
// (over every process) divided by the values per channel. weight undefined: 1.
Tensor backward_elemt(const Tensor& g, const Tensor& x, const Tensor& y, const Tensor& weight, const Tensor& mean,
                      const Tensor& invstd, const Tensor& means, bool relu);

}  // namespace kiln::batch_norm_parts
