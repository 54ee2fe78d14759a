#pragma once
// conv2d's CPU fast path: im2col / col2im over chunks of samples and one BLAS GEMM per group
// and chunk (cpu::gemm: OpenBLAS when built with it), the copies spread over cpu::parallel_for.
// f32 and f64, and f16/bf16 through f32; conv.cpp keeps the loop nest summing in f64 as the
// reference.
#include "backend/cuda/generated/conv/conv_geometry.h"
#include "kiln/tensor.h"

namespace kiln::conv_detail {

using kernels::ConvGeometry;
using kernels::ConvPass;

// forward: (a, b) = (x, w) -> y; grad_input: (gy, w) -> dx; grad_weight: (x, gy) -> dw.
// Inputs of any strides; `out` contiguous. False, having done nothing, for other dtypes
// (or inputs whose dtype is not out's).
bool run_conv_cpu(ConvPass pass, const ConvGeometry& s, const Tensor& a, const Tensor& b, const Tensor& out);

// The same f32 passes through oneDNN (conv_dnnl.cpp, built where oneDNN was found), for
// contiguous inputs; false, having done nothing, where it does not apply (fewer than 8
// channels per group, a shape oneDNN cannot express, or an error it reports).
bool run_conv_dnnl(ConvPass pass, const ConvGeometry& s, const Tensor& a, const Tensor& b, const Tensor& out);

}  // namespace kiln::conv_detail
