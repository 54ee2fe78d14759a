#include "kiln/runtime/tensor_map.h"

#include <string>

#include "check.h"
#include "driver.h"
#include "kiln/error.h"
#include "kiln/runtime/kernel_plan.h"

namespace kiln::rt {

namespace {

CUtensorMapDataType tma_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    case DType::f16:
      return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    case DType::bf16:
      return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    default:
      throw DTypeError("[tensor_map] dtype " + std::string(dtype_name(dtype)) +
                       " has no TMA tiles here (f32, f16, bf16)");
  }
}

// The descriptor, the checks done: strides in elements, swizzled by 128 bytes, zeros outside.
TensorMap encode(DevicePtr base, CUtensorMapDataType type, std::int64_t es, std::span<const std::int64_t> dims,
                 std::span<const std::int64_t> strides, std::span<const int> box) {
  static_assert(sizeof(TensorMap) == sizeof(CUtensorMap) && alignof(TensorMap) >= alignof(CUtensorMap));
  TensorMap m;
  cuuint64_t d[5], st[4];
  cuuint32_t b[5], step[5];
  for (std::size_t i = 0; i < dims.size(); ++i) {
    d[i] = static_cast<cuuint64_t>(dims[i]);
    b[i] = static_cast<cuuint32_t>(box[i]);
    step[i] = 1;
    if (i > 0) st[i - 1] = static_cast<cuuint64_t>(strides[i - 1] * es);
  }
  if (shape_only()) return m;  // a pass launches nothing that would read it (and may hold no driver)
  KILN_CU(cuTensorMapEncodeTiled(reinterpret_cast<CUtensorMap*>(&m), type, static_cast<cuuint32_t>(dims.size()),
                                 reinterpret_cast<void*>(static_cast<std::uintptr_t>(base)), d, st, b, step,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return m;
}

}  // namespace

bool tensor_map_fits(DevicePtr base, DType dtype, std::int64_t ld, std::int64_t batch_stride) {
  const auto es = static_cast<std::int64_t>(dtype_size(dtype));
  return base % 16 == 0 && ld > 0 && (ld * es) % 16 == 0 && batch_stride >= 0 && (batch_stride * es) % 16 == 0;
}

TensorMap tiled_tensor_map_128b(DevicePtr base, DType dtype, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                                int box_rows, int box_cols, std::int64_t batch, std::int64_t batch_stride) {
  const CUtensorMapDataType type = tma_type(dtype);
  const auto es = static_cast<std::int64_t>(dtype_size(dtype));
  if (!tensor_map_fits(base, dtype, ld, batch_stride))
    throw ValueError("[tensor_map] base and strides must be multiples of 16 bytes; row stride " +
                     std::to_string(ld * es) + " bytes, batch stride " + std::to_string(batch_stride * es) +
                     " bytes, base offset " + std::to_string(base % 16));
  if (box_cols * es != 128 || box_rows < 1 || box_rows > 256)
    throw ValueError("[tensor_map] a box of " + std::to_string(box_rows) + " x " + std::to_string(box_cols) +
                     " elements: rows must be 128 bytes and at most 256 of them");
  if (batch < 1 || (batch > 1 && batch_stride < rows * ld))
    throw ValueError("[tensor_map] " + std::to_string(batch) + " matrices " + std::to_string(batch_stride) +
                     " elements apart overlap or are none");
  if (rows < 1 || cols < 1 || cols > ld)
    throw ValueError("[tensor_map] a " + std::to_string(rows) + " x " + std::to_string(cols) +
                     " matrix with row stride " + std::to_string(ld) + " is empty or overlaps itself");
  const std::int64_t dims[3] = {cols, rows, batch};
  // Elements between rows and between matrices (one matrix: any multiple of 16 bytes past the rows).
  const std::int64_t strides[2] = {ld, batch > 1 ? batch_stride : rows * ld};
  const int box[3] = {box_cols, box_rows, 1};
  return encode(base, type, es, dims, strides, box);
}

TensorMap tiled_tensor_map_nd(DevicePtr base, DType dtype, std::span<const std::int64_t> dims,
                              std::span<const std::int64_t> strides, std::span<const int> box) {
  const CUtensorMapDataType type = tma_type(dtype);
  const auto es = static_cast<std::int64_t>(dtype_size(dtype));
  if (dims.size() < 2 || dims.size() > 5 || strides.size() + 1 != dims.size() || box.size() != dims.size())
    throw ValueError("[tensor_map] " + std::to_string(dims.size()) + " dimensions, " +
                     std::to_string(strides.size()) + " strides and a box of " + std::to_string(box.size()) +
                     ": need 2 to 5 dimensions, one stride fewer and a box of each");
  if (base % 16 != 0) throw ValueError("[tensor_map] base offset " + std::to_string(base % 16) + " is not 16-byte aligned");
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 1 || box[i] < 1 || box[i] > 256)
      throw ValueError("[tensor_map] dimension " + std::to_string(i) + " of " + std::to_string(dims[i]) +
                       " with a box of " + std::to_string(box[i]) + ": sizes from 1, boxes from 1 to 256");
    if (i > 0 && (strides[i - 1] < 1 || (strides[i - 1] * es) % 16 != 0))
      throw ValueError("[tensor_map] stride " + std::to_string(i - 1) + " of " + std::to_string(strides[i - 1] * es) +
                       " bytes is not a positive multiple of 16");
  }
  if ((box[0] * es) % 16 != 0 || box[0] * es > 128)
    throw ValueError("[tensor_map] a box row of " + std::to_string(box[0] * es) +
                     " bytes: the 128-byte swizzle takes 16 to 128, in steps of 16");
  return encode(base, type, es, dims, strides, box);
}

}  // namespace kiln::rt
