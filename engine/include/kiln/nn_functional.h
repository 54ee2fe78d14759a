#pragma once
// Neural-network functions: softmax, losses, dropout and normalisation. softmax,
// log_softmax, nll_loss, cross_entropy on (N, C) logits, layer_norm and batch_norm are
// registry ops with GPU kernels; the rest are composites of public ops, so autograd comes
// from their parts.
#include <cstdint>
#include <optional>

#include "linalg.h"
#include "random.h"
#include "tensor.h"

namespace kiln {

// Softmax over `dim` (floating dtypes; f16/bf16 computed in f32), stable for large inputs.
Tensor softmax(const Tensor& x, std::int64_t dim = -1);
Tensor log_softmax(const Tensor& x, std::int64_t dim = -1);

enum class Reduction { none, mean, sum };

// -log_probs[n, labels[n, d...], d...] for log_probs (N, C, d...) and integer labels
// (N, d...). mean divides by the number of labels that are not ignore_index (NaN when
// there are none). A label outside [0, C) other than ignore_index: ValueError on the CPU;
// on the GPU (which cannot check without synchronising) that element's loss is NaN and
// its gradient 0.
Tensor nll_loss(const Tensor& log_probs, const Tensor& labels, Reduction reduction = Reduction::mean,
                std::optional<std::int64_t> ignore_index = std::nullopt);

// nll_loss(log_softmax(logits, 1), labels) for logits (N, C, d...). With label_smoothing
// eps in [0, 1) each element's loss is (1 - eps) * nll + eps * mean over classes of
// -log_softmax; ignored elements contribute neither term. Logits (N, C) take one fused op
// (on the GPU one kernel forward, one backward; f16/bf16 computed in f32); labels out of
// range behave as in nll_loss (the fused op names itself: [softmax_cross_entropy]).
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, Reduction reduction = Reduction::mean,
                     double label_smoothing = 0.0, std::optional<std::int64_t> ignore_index = std::nullopt);

// (a - b)^2, reduced; a and b have the same shape.
Tensor mse_loss(const Tensor& a, const Tensor& b, Reduction reduction = Reduction::mean);

// Zeroes each element with probability p (a Philox bernoulli mask: the same seed gives the
// same mask on CPU and GPU) and scales the rest by 1 / (1 - p). Identity when !training or
// p == 0; zeros when p == 1. gen nullptr: the default generator.
Tensor dropout(const Tensor& x, double p = 0.5, bool training = true, Generator* gen = nullptr);

// Normalises over the trailing dims `normalized_shape` (biased variance), then applies
// the optional elementwise weight and bias of that shape. On the GPU one kernel forward (a
// warp or block per row, saving mean and 1/std) and two backward. f16/bf16 compute in f32;
// weight and bias may be f32 beside f16/bf16 x (mixed precision) and are not cast then.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = {}, const Tensor& bias = {},
                  double eps = 1e-5);

// x (N, C) or (N, C, d...), per-channel statistics. training: batch statistics (biased
// variance to normalise); running_mean/var, when given, become (1 - momentum) * running +
// momentum * batch (unbiased variance), in place and without synchronising. Eval: the
// running statistics, which must be given. weight and bias: optional, shape (C). activation
// relu is applied in the same kernel. On the GPU, training takes two kernels (one pass for
// the statistics, which also updates the running ones, then the normalisation), eval one,
// backward two; results are bit-identical from run to run. f16/bf16 x computes in f32 and may
// come with f32 parameters and running statistics (mixed precision), which keep their dtype;
// a channel holding NaN or Inf gets NaN statistics. num_batches_tracked (one i64, a module's
// batch counter), when given, gets one added in training by the statistics kernel, in place.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight = {},
                  const Tensor& bias = {}, bool training = false, double momentum = 0.1, double eps = 1e-5,
                  Activation activation = Activation::none, const Tensor& num_batches_tracked = {});

// batch_norm (with its activation), then max_pool2d(y, kernel) where the kernel's windows tile
// x (N, C, H, W): stride = kernel, no padding; rows and columns past the last whole window are
// not pooled. kernel: one value or (kh, kw). The same values, running statistics and gradients
// as the two calls (bit for bit forward; the backward's sums may differ in rounding), but on the
// GPU the normalized tensor is never stored: two kernels forward (one in eval) and two backward,
// which find each window's maximum again from x. nn::Sequential uses it on the GPU for
// BatchNorm2d, ReLU (optional), MaxPool2d whose windows tile.
Tensor batch_norm_max_pool2d(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                             const Tensor& weight, const Tensor& bias, bool training, double momentum, double eps,
                             Activation activation, std::vector<std::int64_t> kernel,
                             const Tensor& num_batches_tracked = {});

}  // namespace kiln
