#pragma once
// What a Tensor handle points at. Internal: ops reach it through kiln::Tensor.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "kiln/device.h"
#include "kiln/dtype.h"
#include "kiln/runtime/memory.h"
#include "kiln/tensor.h"

namespace kiln {

// Bytes on one device. Views share it, and with it the version counter that
// autograd uses to detect in-place writes to saved tensors.
class Storage {
 public:
  // CUDA storage is allocated stream-ordered on rt::default_stream(device).
  Storage(std::size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  Device device() const { return device_; }
  std::size_t bytes() const { return bytes_; }
  // Host pointer on cpu, device address on cuda.
  void* data() const {
    if (device_.is_cpu()) return host_;
    if (rt::is_planned(buffer_.ptr())) [[unlikely]]
      return planned_data();
    return reinterpret_cast<void*>(buffer_.ptr());
  }
  bool is_private() const { return buffer_.is_private(); }  // owned by a captured graph's pool
  std::uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }

 private:
  // Storage made in a shape-only pass holds an address, not memory. Outside the pass it takes
  // memory on first use, zero-filled as the pass read it (an optimizer's slots, a parameter's
  // gradient that a pass of the real step made); ValueError inside a graph capture.
  void* planned_data() const;

  Device device_;
  std::size_t bytes_;
  void* host_ = nullptr;
  mutable rt::DeviceBuffer buffer_;
  std::atomic<std::uint64_t> version_{0};
};

struct LowPrecisionCopy;

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  DType dtype = DType::f32;
  Shape shape, strides;
  std::int64_t offset = 0;

  // Autograd: a leaf has requires_grad and no grad_fn; an op output has a grad_fn.
  bool requires_grad = false;
  Tensor grad;
  // zero_grad inside a compiled call: `grad` holds stale values that count as zeros. The next
  // accumulation copies instead of adding; any other read zeroes it first (one kernel fewer).
  bool grad_is_zero = false;
  std::vector<std::function<void(const Tensor&)>> grad_ready_hooks;  // Tensor::add_grad_ready_hook
  std::shared_ptr<Node> grad_fn;
  int output_nr = 0;

  // A view made by a view op keeps the tensor whose storage it views (never itself a view):
  // an in-place write through the view must rewrite that base's history too.
  std::shared_ptr<TensorImpl> view_base;
  // On a base: bumped whenever its history is rewritten in place. On a view: the base's
  // epoch its grad_fn was made from; a view whose epoch is behind is re-derived from the base.
  std::uint64_t history_epoch = 0;
  // On a parameter: autocast's f16/bf16 copy of it (ops/amp.cpp), which the optimizers keep
  // current as they update the parameter, so a forward reads it without a cast kernel.
  std::shared_ptr<LowPrecisionCopy> low_precision;

  void* data() const {
    return static_cast<char*>(storage->data()) + offset * static_cast<std::int64_t>(dtype_size(dtype));
  }
};

// A parameter's low-precision copy is current while the parameter's storage and both storages'
// versions are the ones recorded when it was last written: any other write to either shows.
struct LowPrecisionCopy {
  Tensor copy;
  std::weak_ptr<Storage> source;
  std::uint64_t source_version = 0, copy_version = 0;

  bool current_for(const TensorImpl& param) const;
  // After the copy was written from param's present values: bumps the copy's version and
  // records both.
  void written_from(const TensorImpl& param);
};

// ShapeError for a negative dim, or when the nonzero dims' product times element_size passes
// int64: every stride, element count and byte offset of a valid shape fits.
void check_shape(const Shape& shape, std::size_t element_size);

// A new contiguous tensor with uninitialised contents.
std::shared_ptr<TensorImpl> make_impl(const Shape& shape, DType dtype, Device device);

}  // namespace kiln
