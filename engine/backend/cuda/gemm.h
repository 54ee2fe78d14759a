#pragma once
// Strided-batched GEMM on device pointers through cuBLAS, the GPU side of matmul:
//   C[b] = alpha * A[b] @ B[b] + beta * C[b],  A[b] is (M,K), B[b] is (K,N), C[b] is (M,N)
// in row-major terms. Each operand gives element strides: batch (0 = the same matrix for
// every b), row and column; a transposed view is just a row stride of 1 and costs no copy.
// Same contract as cpu::gemm (engine/core/cpu/gemm_cpu.h), which the tests compare it with.
#include <cstdint>

#include "kiln/dtype.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/memory.h"

namespace kiln::kernels {

struct GemmShape {
  std::int64_t batch = 1, m = 0, n = 0, k = 0;
};

struct GemmOperand {
  rt::DevicePtr ptr = 0;  // element [0,0] of batch 0
  std::int64_t batch_stride = 0, row_stride = 0, col_stride = 1;
};

// Whether cuBLAS can take a (rows, cols) operand as it stands: unit stride along one axis
// and rows/columns that do not overlap (size-1 axes take any stride). Otherwise the caller
// makes it contiguous first (for C: computes into a contiguous buffer and copies back).
bool gemm_layout_ok(std::int64_t rows, std::int64_t cols, std::int64_t row_stride, std::int64_t col_stride);

// f32 GEMMs on TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32): process-wide, off by default.
void set_allow_tf32(bool allow);
bool allow_tf32();

// Enqueues the GEMM on `s`, whose device must hold the pointers. dtype f32, f64, f16 or bf16;
// f16/bf16 accumulate in f32 and round once. Returns false, enqueuing nothing, when an
// operand fails gemm_layout_ok. K == 0 or alpha == 0 gives C = beta*C without reading A or B;
// beta == 0 never reads C; M, N or batch == 0 does nothing. DTypeError for other dtypes,
// ShapeError for negative sizes, ValueError when C broadcasts over a batch of more than one.
[[nodiscard]] bool gemm(DType dtype, const GemmShape& shape, double alpha, const GemmOperand& a, const GemmOperand& b,
                        double beta, const GemmOperand& c, const rt::Stream& s);

}  // namespace kiln::kernels
