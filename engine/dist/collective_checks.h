#pragma once
// What every collective checks of its tensors before NCCL sees them (CPU-testable).
#include <string_view>

#include "kiln/device.h"
#include "kiln/tensor.h"
#include "nccl_loader.h"

namespace kiln::dist::detail {

// NCCL's type for `t`; DTypeError, DeviceError or ValueError starting "[<op>] " when t is
// undefined, of an unsupported dtype (bool), not on `group_device`, or not contiguous.
rt::nccl::DataType checked_nccl_type(const Tensor& t, Device group_device, std::string_view op);

}  // namespace kiln::dist::detail
