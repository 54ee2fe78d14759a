#pragma once
// TMA descriptors: how the tensor memory accelerator reads a matrix in tiles. A kernel takes one
// by value (a __grid_constant__ parameter) and names it in its bulk tensor copies.
#include <cstdint>
#include <span>

#include "kiln/dtype.h"
#include "kiln/runtime/memory.h"

namespace kiln::rt {

// A CUtensorMap's 128 opaque bytes.
struct alignas(128) TensorMap {
  std::uint64_t words[16]{};
};

// `batch` row-major (rows x cols) matrices of f32, f16 or bf16, row stride `ld` and
// `batch_stride` elements apart, read in boxes of box_rows x box_cols of one matrix with the
// 128-byte swizzle (so box_cols * element size must be 128 bytes). Elements past a matrix read
// as zero. ValueError names what TMA cannot take: a base or stride that is not a multiple of 16
// bytes, a box row other than 128 bytes, a box taller than 256 rows.
TensorMap tiled_tensor_map_128b(DevicePtr base, DType dtype, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                                int box_rows, int box_cols, std::int64_t batch = 1, std::int64_t batch_stride = 0);

// A tensor of 2 to 5 dimensions (dims[0] contiguous; strides[i] elements between steps of
// dims[i + 1]) read in boxes of `box` elements with the 128-byte swizzle: box[0] * element size
// must be 16 to 128 bytes, a multiple of 16. Coordinates may run past either end of a
// dimension (negative ones included): those elements read as zero. ValueError as above.
TensorMap tiled_tensor_map_nd(DevicePtr base, DType dtype, std::span<const std::int64_t> dims,
                              std::span<const std::int64_t> strides, std::span<const int> box);

// Whether tiled_tensor_map_128b takes matrices at `base` with row stride `ld` elements (and
// `batch_stride` between them).
bool tensor_map_fits(DevicePtr base, DType dtype, std::int64_t ld, std::int64_t batch_stride = 0);

}  // namespace kiln::rt
