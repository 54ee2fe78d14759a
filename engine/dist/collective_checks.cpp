#include "collective_checks.h"

#include <string>

#include "kiln/error.h"

namespace kiln::dist::detail {

rt::nccl::DataType checked_nccl_type(const Tensor& t, Device group_device, std::string_view op) {
  const std::string who = std::string("[").append(op).append("] ");  // (operator+ trips GCC 12 -Wrestrict)
  if (!t.defined()) throw ValueError(who + "the tensor is undefined");
  rt::nccl::DataType type{};
  switch (t.dtype()) {
    case DType::f16:
      type = rt::nccl::kFloat16;
      break;
    case DType::bf16:
      type = rt::nccl::kBfloat16;
      break;
    case DType::f32:
      type = rt::nccl::kFloat32;
      break;
    case DType::f64:
      type = rt::nccl::kFloat64;
      break;
    case DType::i32:
      type = rt::nccl::kInt32;
      break;
    case DType::i64:
      type = rt::nccl::kInt64;
      break;
    case DType::u8:
      type = rt::nccl::kUint8;
      break;
    default:
      throw DTypeError(who + "dtype " + std::string(dtype_name(t.dtype())) +
                       " is not supported (f16, bf16, f32, f64, i32, i64, u8)");
  }
  if (t.device() != group_device)
    throw DeviceError(who + "the tensor is on " + t.device().str() + "; this process group's device is " +
                      group_device.str());
  if (!t.is_contiguous())
    throw ValueError(who + "the tensor " + shape_str(t.shape()) + " with strides " + shape_str(t.strides()) +
                     " is not contiguous (collectives write in place: use a contiguous tensor and copy back)");
  return type;
}

}  // namespace kiln::dist::detail
