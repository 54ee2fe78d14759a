#pragma once
// Internal to runtime/src: how DeviceBuffer (memory.cpp) consults the private-pool bindings
// (private_pool.cpp).
#include <memory>

#include "kiln/runtime/memory.h"

namespace kiln::rt {

struct ParkedFree {
  DevicePtr ptr;
  std::size_t bytes;
  void* stream;
  int device;
  std::shared_ptr<PrivatePool> pool{};  // a private block's pool; null: the driver's pool
};

// While alive, this thread's stream-capture mode is relaxed: allocating and mapping device
// memory are not stream work, and a capturing thread may call them only in that mode.
class RelaxedCapture {
 public:
  RelaxedCapture();
  ~RelaxedCapture();
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  int mode_;
};

// The pool bound to `stream`, or null (the usual case costs one atomic load).
std::shared_ptr<PrivatePool> bound_pool(void* stream);
// Keeps a freed block until the stream's pool is unbound: a driver-pool block whenever one is
// bound, a private one only where the binding holds frees; false when it is not kept.
bool park_if_bound(const ParkedFree& f);
// Bytes the private pools of `device` hold from the driver.
std::size_t private_bytes(int device);
// Returns a driver-pool block to the stream's cache or the pool (memory.cpp).
void recycle_block(DevicePtr p, std::size_t bytes, void* stream, int device) noexcept;

}  // namespace kiln::rt
