#pragma once
// 2-D convolution and pooling on NCHW tensors (f32, f64, f16, bf16). Window sizes,
// strides, paddings and dilations take one value (both dims) or two (height, width).
#include <cstdint>
#include <vector>

#include "tensor.h"

namespace kiln {

struct Conv2dOptions {
  std::vector<std::int64_t> stride{1};
  std::vector<std::int64_t> padding{0};  // zeros on both sides
  std::vector<std::int64_t> dilation{1};
  std::int64_t groups = 1;
};

// x (N, C, H, W), w (O, C/groups, kh, kw), bias (O) or undefined -> (N, O, OH, OW) with
// OH = (H + 2*ph - dh*(kh-1) - 1) / sh + 1.
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor(), const Conv2dOptions& options = {});

// The two gradients of conv2d as plain ops (what its backward pass runs): the input
// gradient of shape `input_shape` from gy (N, O, OH, OW) and w, and the weight gradient of
// shape `weight_shape` from x and gy.
Tensor conv2d_grad_input(const Tensor& gy, const Tensor& w, const Shape& input_shape, const Conv2dOptions& options = {});
Tensor conv2d_grad_weight(const Tensor& x, const Tensor& gy, const Shape& weight_shape,
                          const Conv2dOptions& options = {});

// On the GPU, bf16 and f16 convolutions, and f32 ones with TF32 allowed, run kernels generated
// for the exact shape on tensor cores (f32 accumulation). There, a tap over the padding
// multiplies a zero by its weight, so an infinite weight gives NaN (as in cuDNN); the CPU and
// the exact f32/f64 path leave such taps out.
// f32 convolutions on the GPU may use TF32 tensor cores (about 10 mantissa bits), as in
// PyTorch: on by default, process-wide; matmul's switch (set_allow_tf32) is separate.
void set_allow_conv_tf32(bool allow);
bool allow_conv_tf32();

// While one lives on this thread, a conv2d forward on the GPU also sums each channel of its
// output (the values as stored, and their squares, in f64) where its kernel can, and a training
// batch norm that reads that output, unwritten, takes those sums instead of a statistics pass
// of its own: one kernel fewer. Sums nobody took are dropped when the scope ends.
// nn::Sequential opens one around a Conv2d followed by a training BatchNorm2d.
class ConvStatsForBatchNorm {
 public:
  ConvStatsForBatchNorm();
  ~ConvStatsForBatchNorm();
  ConvStatsForBatchNorm(const ConvStatsForBatchNorm&) = delete;
  ConvStatsForBatchNorm& operator=(const ConvStatsForBatchNorm&) = delete;
};

// Windows over padding never pick it (it reads as -inf); padding <= kernel/2. An empty
// stride means the kernel size.
Tensor max_pool2d(const Tensor& x, std::vector<std::int64_t> kernel, std::vector<std::int64_t> stride = {},
                  std::vector<std::int64_t> padding = {0}, std::vector<std::int64_t> dilation = {1});
// Padding counts as zeros; count_include_pad=false divides by the window's elements inside x.
Tensor avg_pool2d(const Tensor& x, std::vector<std::int64_t> kernel, std::vector<std::int64_t> stride = {},
                  std::vector<std::int64_t> padding = {0}, bool count_include_pad = true);

}  // namespace kiln
