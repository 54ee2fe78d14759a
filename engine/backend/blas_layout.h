#pragma once
// How a strided matrix maps onto a BLAS call, shared by the CPU matmul (OpenBLAS) and the
// cuBLAS path: which operands a call takes as they are, and which need a contiguous copy.
#include <cstdint>
#include <optional>

namespace kiln::blas {

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

}  // namespace kiln::blas
