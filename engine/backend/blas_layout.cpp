#include "blas_layout.h"

#include <algorithm>

namespace kiln::blas {

std::optional<BlasOperand> blas_operand(std::int64_t rows, std::int64_t cols, std::int64_t row_stride,
                                        std::int64_t col_stride) {
  if (cols <= 1 || col_stride == 1) {  // row-major: rows are ld >= cols apart
    const std::int64_t min_ld = std::max<std::int64_t>(1, cols);
    if (rows <= 1) return BlasOperand{false, min_ld};
    if (row_stride >= min_ld) return BlasOperand{false, row_stride};
  }
  if (rows <= 1 || row_stride == 1) {  // column-major: the transpose is row-major
    const std::int64_t min_ld = std::max<std::int64_t>(1, rows);
    if (cols <= 1) return BlasOperand{true, min_ld};
    if (col_stride >= min_ld) return BlasOperand{true, col_stride};
  }
  return std::nullopt;
}

std::optional<BlasGemm> blas_output(std::int64_t m, std::int64_t n, std::int64_t c_row, std::int64_t c_col) {
  auto c = blas_operand(m, n, c_row, c_col);
  if (!c) return std::nullopt;
  BlasGemm g;
  g.swap_ab = c->trans;
  g.m = c->trans ? n : m;
  g.n = c->trans ? m : n;
  g.c = BlasOperand{false, c->ld};
  return g;
}

std::optional<BlasGemm> blas_gemm(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t a_row,
                                  std::int64_t a_col, std::int64_t b_row, std::int64_t b_col, std::int64_t c_row,
                                  std::int64_t c_col) {
  auto g = blas_output(m, n, c_row, c_col);
  if (!g) return std::nullopt;
  g->k = k;
  // C^T = B^T @ A^T; transposing a view swaps its strides.
  auto first = g->swap_ab ? blas_operand(n, k, b_col, b_row) : blas_operand(m, k, a_row, a_col);
  auto second = g->swap_ab ? blas_operand(k, m, a_col, a_row) : blas_operand(k, n, b_row, b_col);
  if (!first || !second) return std::nullopt;
  g->a = *first;
  g->b = *second;
  return g;
}

}  // namespace kiln::blas
