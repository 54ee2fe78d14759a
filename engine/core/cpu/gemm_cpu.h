#pragma once
// Strided-batched GEMM on host pointers, the CPU side of matmul:
//   C[b] = alpha * A[b] @ B[b] + beta * C[b],  A[b] is (M,K), B[b] is (K,N), C[b] is (M,N)
// in row-major terms. Each operand gives element strides: batch (0 = the same matrix for
// every b), row and column; a transposed view is just a row stride of 1.
// Semantics shared with kernels::gemm (the cuBLAS side): K == 0 or alpha == 0 gives
// C = beta*C without reading A or B; beta == 0 never reads C; M, N or batch == 0 does nothing.
#include <cstdint>
#include <optional>

#include "backend/blas_layout.h"
#include "kiln/dtype.h"

namespace kiln::cpu {

// How a strided matrix maps onto a BLAS call: shared with the cuBLAS path.
using blas::BlasGemm;
using blas::BlasOperand;
using blas::blas_gemm;
using blas::blas_operand;
using blas::blas_output;

struct GemmShape {
  std::int64_t batch = 1, m = 0, n = 0, k = 0;
};

struct GemmOperand {
  const void* data = nullptr;  // element [0,0] of batch 0
  std::int64_t batch_stride = 0, row_stride = 0, col_stride = 1;
};

struct GemmOutput {
  void* data = nullptr;
  std::int64_t batch_stride = 0, row_stride = 0, col_stride = 1;
};

// ---- Entry points ----

// dtype f32, f64, f16, bf16 (f16/bf16 computed in f32 and rounded once), i32, i64 (exact,
// wrapping modulo 2^bits; alpha and beta must be integers). Uses OpenBLAS when built with
// it and the layout allows, else gemm_blocked. DTypeError for u8/bool, ShapeError for
// negative sizes, ValueError when C broadcasts over a batch of more than one.
void gemm(DType dtype, const GemmShape& shape, double alpha, const GemmOperand& a, const GemmOperand& b, double beta,
          const GemmOutput& c);

// Packed, cache-blocked loops: any strides, every dtype gemm takes.
void gemm_blocked(DType dtype, const GemmShape& shape, double alpha, const GemmOperand& a, const GemmOperand& b,
                  double beta, const GemmOutput& c);

// OpenBLAS sgemm/dgemm (f16/bf16 through f32 copies). False, writing nothing, when kiln was
// built without OpenBLAS, the dtype is an integer one or the layout needs a copy.
bool gemm_blas(DType dtype, const GemmShape& shape, double alpha, const GemmOperand& a, const GemmOperand& b,
               double beta, const GemmOutput& c);
bool have_blas();

}  // namespace kiln::cpu
