#pragma once
// Strided-batched GEMM on host pointers, the CPU side of matmul:
//   C[b] = alpha * A[b] @ B[b] + beta * C[b],  A[b] is (M,K), B[b] is (K,N), C[b] is (M,N)
// in row-major terms. Each operand gives element strides: batch (0 = the same matrix for
// every b), row and column; a transposed view is just a row stride of 1.
// Semantics shared with kernels::gemm (the cuBLAS side): K == 0 or alpha == 0 gives
// C = beta*C without reading A or B; beta == 0 never reads C; M, N or batch == 0 does nothing.
#include <cstdint>
#include <optional>

#include "kiln/dtype.h"

namespace kiln::cpu {

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

// ---- How a strided matrix maps onto a BLAS call (shared with the cuBLAS path) ----

// A (rows, cols) matrix as row-major BLAS sees it: stored as itself with leading dimension
// ld, or (trans) stored as its transpose, i.e. column-major.
struct BlasOperand {
  bool trans = false;
  std::int64_t ld = 1;
};
// nullopt when neither axis has unit stride or the leading dimension would overlap
// (broadcast or negative strides): the caller makes such an operand contiguous first.
// Strides of size-1 axes do not matter.
std::optional<BlasOperand> blas_operand(std::int64_t rows, std::int64_t cols, std::int64_t row_stride,
                                        std::int64_t col_stride);

// One row-major BLAS call for a problem. When C is stored column-major the call computes
// C^T = B^T @ A^T instead: swap_ab, m and n exchanged, and `a`/`b` are the call's first and
// second operands (B^T and A^T) in that case.
struct BlasGemm {
  bool swap_ab = false;
  std::int64_t m = 0, n = 0, k = 0;
  BlasOperand a, b, c;
};
// nullopt when any of A, B, C needs a copy.
std::optional<BlasGemm> blas_gemm(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t a_row,
                                  std::int64_t a_col, std::int64_t b_row, std::int64_t b_col, std::int64_t c_row,
                                  std::int64_t c_col);
// The same for C alone, as the C = beta*C path needs: C as (rows, cols) row-major with ld.
std::optional<BlasGemm> blas_output(std::int64_t m, std::int64_t n, std::int64_t c_row, std::int64_t c_col);

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
