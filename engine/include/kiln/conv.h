#pragma once
// 2-D convolution and pooling on NCHW tensors (f32, f64, f16, bf16). Window sizes,
// strides, paddings and dilations take one value (both dims) or two (height, width).
#include <cstdint>
#include <vector>

#include "kiln/tensor.h"

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

// Windows over padding never pick it (it reads as -inf); padding <= kernel/2. An empty
// stride means the kernel size.
Tensor max_pool2d(const Tensor& x, std::vector<std::int64_t> kernel, std::vector<std::int64_t> stride = {},
                  std::vector<std::int64_t> padding = {0}, std::vector<std::int64_t> dilation = {1});
// Padding counts as zeros; count_include_pad=false divides by the window's elements inside x.
Tensor avg_pool2d(const Tensor& x, std::vector<std::int64_t> kernel, std::vector<std::int64_t> stride = {},
                  std::vector<std::int64_t> padding = {0}, bool count_include_pad = true);

}  // namespace kiln
