#include "kiln/runtime/tensor_map.h"

#include <string>

#include "check.h"
#include "driver.h"
#include "kiln/error.h"

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
  static_assert(sizeof(TensorMap) == sizeof(CUtensorMap) && alignof(TensorMap) >= alignof(CUtensorMap));
  TensorMap m;
  const auto u64 = [](std::int64_t v) { return static_cast<cuuint64_t>(v); };
  const cuuint64_t dims[3] = {u64(cols), u64(rows), u64(batch)};
  // Bytes between rows and between matrices (one matrix: any multiple of 16 past the rows).
  const cuuint64_t strides[2] = {u64(ld * es), u64((batch > 1 ? batch_stride : rows * ld) * es)};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t step[3] = {1, 1, 1};
  KILN_CU(cuTensorMapEncodeTiled(reinterpret_cast<CUtensorMap*>(&m), type, 3,
                                 reinterpret_cast<void*>(static_cast<std::uintptr_t>(base)), dims, strides, box, step,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return m;
}

}  // namespace kiln::rt
