#pragma once
// conv2d's three passes as implicit GEMMs on tensor cores, generated per exact shape
// (kernel_templates/conv_igemm.cu): bf16 and f16 inputs, and f32 through TF32 when
// allow_conv_tf32(). conv.cpp falls back to im2col + cuBLAS where run_conv_igemm declines.
#include <cstdint>
#include <string>

#include "kiln/tensor.h"

namespace kiln::conv_detail {

enum class ConvPass { forward = 0, grad_input = 1, grad_weight = 2 };

// Sizes of one convolution (NCHW input, OIHW weight).
struct ConvSizes {
  std::int64_t n, c, h, w, o, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, groups;
};

// forward: (a, b) = (x, w) -> out = y; grad_input: (gy, w) -> dx; grad_weight: (gy, x) -> dw.
// All contiguous on one GPU. Returns false, having done nothing, when the generated kernel
// does not apply (f64, f32 without TF32, mixed dtypes, pre-sm_80 devices, huge tensors or
// KILN_CONV_IGEMM=0), so the caller takes its fallback.
bool run_conv_igemm(ConvPass pass, const ConvSizes& s, const Tensor& a, const Tensor& b, const Tensor& out,
                    bool relu = false);

// Stride-1 forward (flip = false) or input gradient (flip = true: a = gy, b = w, out = dx)
// from input patches staged in shared memory (kernel_templates/conv_patch.cu); needs the
// input channels per group to be a multiple of 16 (8 for TF32). Returns false, having done
// nothing, where it does not apply.
bool run_conv_patch(bool flip, const ConvSizes& s, const Tensor& a, const Tensor& b, const Tensor& out);
std::string conv_patch_source(bool flip, const ConvSizes& s, DType t, int sm_count);

// The MMA for these dtypes (0 bf16, 1 f16, 2 tf32), or -1 when no generated kernel applies.
int conv_mma_for(DType ta, DType tb, DType to);

// The kernel run_conv_igemm would generate for dtype t on a device of `sm_count` SMs; empty
// when none applies. Lets tests compile every configuration with NVRTC without a GPU.
std::string conv_igemm_source(ConvPass pass, const ConvSizes& s, DType t, bool relu, int sm_count);

}  // namespace kiln::conv_detail
