#pragma once
// batch_norm's CPU fast path: f32/f64 inputs read in place, one channel per item over
// cpu::parallel_for, statistics summed in double as in the reference. norm_batch.cpp keeps
// its plain loops as .cpu_reference (and for f16/bf16).
#include <span>

#include "norm_common.h"

namespace kiln::norm_detail {

// Attrs: training (bool), momentum, eps (double), relu (bool), has_weight, has_bias,
// has_running_mean, has_running_var (bool, default true).
struct BatchNormParams {
  bool training, relu, weight, bias, rm, rv;
  double momentum, eps;
};
BatchNormParams batch_norm_params(const Attrs& a);

// Forward: inputs x, weight, bias, running_mean, running_var; outputs y, mean, invstd.
// Backward: inputs g, x, y, weight, mean, invstd; outputs dx, dweight, dbias.
// Both return false, having done nothing, when x is not f32 or f64.
bool batch_norm_forward_fast(const OpArgs& a, std::span<Tensor> out);
bool batch_norm_backward_fast(const OpArgs& a, std::span<Tensor> out);

}  // namespace kiln::norm_detail
