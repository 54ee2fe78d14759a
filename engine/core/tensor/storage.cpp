#include <mutex>

#include "core/cpu/host_blocks.h"
#include "kiln/error.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/graph.h"
#include "kiln/runtime/kernel_plan.h"
#include "kiln/runtime/memory.h"
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

void* Storage::planned_data() const {
  if (rt::shape_only()) return reinterpret_cast<void*>(buffer_.ptr());
  static std::mutex mu;  // rare: once per storage that outlived its pass
  std::lock_guard lock(mu);
  if (rt::is_planned(buffer_.ptr())) {
    if (rt::thread_capturing())
      throw ValueError(
          "[tensor] a tensor made in a shape-only pass (plan_kernels) is first used in a graph capture, "
          "where its memory cannot be taken and zeroed; use it once before the capture");
    const rt::Stream& s = rt::default_stream(device_.index());
    rt::DeviceBuffer memory(bytes_, s);
    rt::memset_device(memory.ptr(), 0, bytes_, s);
    buffer_ = std::move(memory);
  }
  return reinterpret_cast<void*>(buffer_.ptr());
}

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
