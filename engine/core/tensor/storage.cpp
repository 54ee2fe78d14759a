#include "core/cpu/host_blocks.h"
#include "kiln/error.h"
#include "kiln/runtime/device.h"
#include "tensor_impl.h"

namespace kiln {

Storage::Storage(std::size_t bytes, Device device) : device_(device), bytes_(bytes) {
  if (bytes == 0) return;
  if (device.is_cpu()) {
    host_ = cpu::host_alloc(bytes);
  } else {
    buffer_ = rt::DeviceBuffer(bytes, rt::default_stream(device.index()));
  }
}

Storage::~Storage() { cpu::host_free(host_, bytes_); }

std::shared_ptr<TensorImpl> make_impl(const Shape& shape, DType dtype, Device device) {
  check_shape(shape, dtype_size(dtype));
  const std::int64_t n = shape_numel(shape);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(static_cast<std::size_t>(n) * dtype_size(dtype), device);
  impl->dtype = dtype;
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  return impl;
}

bool LowPrecisionCopy::current_for(const TensorImpl& param) const {
  const Storage* from = param.storage.get();
  const Storage* to = copy.defined() ? copy.impl()->storage.get() : nullptr;
  return from && to && source.lock().get() == from && source_version == from->version() &&
         copy_version == to->version();
}

void LowPrecisionCopy::written_from(const TensorImpl& param) {
  copy.impl()->storage->bump_version();  // tensors saved from the copy see the write
  source = param.storage;
  source_version = param.storage->version();
  copy_version = copy.impl()->storage->version();
}

}  // namespace kiln
