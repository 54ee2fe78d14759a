#pragma once
// The strided matrix operands the GEMM suites (CPU and GPU) build: how a batch of
// (rows, cols) matrices sits in memory, and how many elements it spans.
#include <cstdint>

namespace kiln_test {

// N row-major, T column-major (a transposed view), P row-major with padded rows, S no unit
// stride at all (BLAS needs a copy).
enum class Layout { N, T, P, S };
inline const char* layout_name(Layout l) {
  return l == Layout::N ? "N" : l == Layout::T ? "T" : l == Layout::P ? "P" : "S";
}

struct MatrixStrides {
  std::int64_t bs = 0, rs = 0, cs = 1;  // batch, row and column strides in elements
  std::int64_t elements = 0;            // storage the whole batch spans
};

// `pad` extra elements per row for P; a broadcast batch shares one matrix (batch stride 0).
inline MatrixStrides matrix_strides(Layout l, std::int64_t batch, std::int64_t r, std::int64_t c, bool broadcast,
                                    std::int64_t pad) {
  MatrixStrides m;
  switch (l) {
    case Layout::N:
      m.rs = c, m.cs = 1;
      break;
    case Layout::T:
      m.rs = 1, m.cs = r;
      break;
    case Layout::P:
      m.rs = c + pad, m.cs = 1;
      break;
    case Layout::S:
      m.rs = 2 * c + 1, m.cs = 2;
      break;
  }
  const std::int64_t span = (r > 0 && c > 0) ? (r - 1) * m.rs + (c - 1) * m.cs + 1 : 1;
  m.bs = broadcast ? 0 : span;
  m.elements = (broadcast || batch <= 1 ? 0 : (batch - 1) * m.bs) + span;
  return m;
}

}  // namespace kiln_test
