#pragma once
// conv2d's three passes as implicit GEMMs on tensor cores, generated per exact shape
// (kernel_templates/conv_igemm.cu): bf16 and f16 inputs, and f32 through TF32 when
// allow_conv_tf32(). conv.cpp falls back to im2col + cuBLAS where run_conv_igemm declines.
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "kiln/runtime/device.h"
#include "kiln/runtime/generated_kernels.h"
#include "kiln/tensor.h"

namespace kiln::conv_detail {

enum class ConvPass { forward = 0, grad_input = 1, grad_weight = 2 };

// Sizes of one convolution (NCHW input, OIHW weight).
struct ConvSizes {
  std::int64_t n, c, h, w, o, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, groups;
};

// forward: (a, b) = (x, w) -> out = y; grad_input: (gy, w) -> dx; grad_weight: (gy, x) -> dw.
// All contiguous on one GPU. f32 without TF32 runs exact FFMA kernels (conv_ffma.cu). Returns
// false, having done nothing, when no generated kernel applies (f64, mixed dtypes, pre-sm_80
// devices, huge tensors or KILN_CONV_IGEMM=0), so the caller takes its fallback.
// `tiles` overrides the heuristic's block tile (the tuner's alternatives); launch = false only
// says whether the kernel applies.
struct ConvTiles {
  int bm = 0, bn = 0;  // 0: the heuristic's
};
bool run_conv_igemm(ConvPass pass, const ConvSizes& s, const Tensor& a, const Tensor& b, const Tensor& out,
                    ConvTiles tiles = {}, bool launch = true);
// Tiles worth timing beside the heuristic's (which is not listed) for dtype t.
std::vector<ConvTiles> igemm_alternatives(ConvPass pass, const ConvSizes& s, DType t, int sm_count);

// Stride-1 forward (flip = false) or input gradient (flip = true: a = gy, b = w, out = dx)
// from input patches staged in shared memory (kernel_templates/conv_patch.cu); needs the
// input channels per group to be a multiple of 16 (8 for TF32). Returns false, having done
// nothing, where it does not apply.
// rows > 0 overrides the heuristic's band of output rows per block; launch as for igemm.
bool run_conv_patch(bool flip, const ConvSizes& s, const Tensor& a, const Tensor& b, const Tensor& out, int rows = 0,
                    bool launch = true);
// Bands worth timing beside the heuristic's for dtype t.
std::vector<int> patch_alternatives(bool flip, const ConvSizes& s, DType t, int sm_count, int max_smem);
std::string conv_patch_source(bool flip, const ConvSizes& s, DType t, int sm_count, int rows = 0);

// Stride-1 weight gradient (a = x, b = gy, out = dw) from staged gy and input rows
// (kernel_templates/conv_wgrad.cu); input channels per group in 8s, kernels up to 8 wide.
bool run_conv_wgrad(const ConvSizes& s, const Tensor& x, const Tensor& gy, const Tensor& dw, bool launch = true);
std::string conv_wgrad_source(const ConvSizes& s, DType t, int sm_count);

// Weight gradient (a = x, b = gy, out = dw) of a conv with at most 256 kernel rows (O * C * KH,
// groups 1) up to 8 wide, on CUDA cores in f32 (kernel_templates/conv_wgrad_small.cu): a first
// conv over few input channels, whose long sum over pixels tensor-core tiles would spread thin.
bool run_conv_wgrad_small(const ConvSizes& s, const Tensor& x, const Tensor& gy, const Tensor& dw,
                          bool launch = true);

// The pass on the generated kernel measured fastest for this problem (kernels::run_tuned over
// the paths above and their tiles); false, having done nothing, when none applies.
bool run_generated_conv(ConvPass pass, const ConvSizes& s, const Tensor& a, const Tensor& b, const Tensor& out);
std::string conv_wgrad_small_source(const ConvSizes& s, DType t, int sm_count);

// Adds the 16 sizes to the key of a generated conv module (rt::generated_kernels).
void add_sizes(rt::GeneratedKey& key, const ConvSizes& s);
// False when KILN_CONV_IGEMM=0 asks for im2col + cuBLAS everywhere.
bool generated_convs_enabled();
// The device a generated conv kernel runs on for these tensors (out first), or nullptr when none
// may: generated convs switched off, a device before sm_80, or a tensor past 32-bit indexing.
const rt::DeviceInfo* generated_conv_device(std::initializer_list<const Tensor*> tensors);

// The MMA for these dtypes (0 bf16, 1 f16, 2 tf32), or -1 when no tensor-core kernel applies.
int conv_mma_for(DType ta, DType tb, DType to);
// The implicit GEMM's kind: conv_mma_for's MMA, else kFfma for f32 with TF32 off (exact f32 on
// the CUDA cores, kernel_templates/conv_ffma.cu), else -1.
inline constexpr int kFfma = 3;
int igemm_kind_for(DType ta, DType tb, DType to);

// The kernel run_conv_igemm would generate for dtype t on a device of `sm_count` SMs; empty
// when none applies. Lets tests compile every configuration with NVRTC without a GPU.
std::string conv_igemm_source(ConvPass pass, const ConvSizes& s, DType t, int sm_count, ConvTiles tiles = {});

}  // namespace kiln::conv_detail
