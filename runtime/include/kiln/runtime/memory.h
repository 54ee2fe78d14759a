#pragma once
// Device memory from the driver's stream-ordered pool (one per device, high
// release threshold) and host<->device copies.
#include <cstddef>
#include <cstdint>
#include <memory>

namespace kiln::rt {

class Stream;
using DevicePtr = std::uint64_t;  // CUdeviceptr

// Allocates `bytes` on the stream's device, ordered on `s`. Throws CudaError
// naming the bytes requested and the pool's usage when the pool is exhausted. Inside a
// shape-only pass it hands out a planned address instead: no memory, no context needed.
DevicePtr device_alloc(std::size_t bytes, const Stream& s);
// Planned addresses lie above any a driver gives (57-bit virtual addresses at most).
inline constexpr DevicePtr kPlannedAddresses = DevicePtr{0xfe} << 56;
inline bool is_planned(DevicePtr p) { return p >= kPlannedAddresses; }
// Frees in stream order; never throws (errors are logged).
void device_free(DevicePtr p, const Stream& s) noexcept;

struct PoolUsage {
  std::size_t reserved = 0;  // bytes the pool holds from the driver
  std::size_t used = 0;      // bytes handed out, including `cached`
  std::size_t cached = 0;    // freed DeviceBuffer blocks kept for reuse on their stream
  std::size_t private_bytes = 0;  // held by private pools (captured graphs), outside the driver's pool
};
PoolUsage pool_usage(int device);  // all zeros in a shape-only pass, which allocates addresses only
// DeviceBuffers of up to 64 MiB return their block to a per-stream cache (1 GiB per device
// at most) that later allocations of the same rounded size on that stream reuse. This frees
// the cached blocks to the pool (an allocation the pool cannot serve does it too).
void release_cached_blocks(int device);

// Asynchronous on `s`: pageable `src` is staged through pinned buffers, so it may
// be reused as soon as this returns.
void copy_to_device(DevicePtr dst, const void* src, std::size_t bytes, const Stream& s);
// Returns once `dst` holds the data (waits for earlier work on `s`).
void copy_to_host(void* dst, DevicePtr src, std::size_t bytes, const Stream& s);
void copy_device(DevicePtr dst, DevicePtr src, std::size_t bytes, const Stream& s);
void memset_device(DevicePtr dst, std::uint8_t value, std::size_t bytes, const Stream& s);

// Memory a captured graph owns: blocks are carved from chunks taken with cuMemAlloc and, once
// freed, only serve later requests of the same pool, so no address baked into a graph is ever
// handed to other work. A freed block merges with free neighbours and serves any request it
// holds (smallest fit first), so the pool holds about what is live at once, not every size seen. The chunks go back to
// the driver when the last holder (the graph's owner and every DeviceBuffer carved from it) lets go; that waits for
// `stream` first.
class PrivatePool {
 public:
  PrivatePool(int device, void* stream);
  ~PrivatePool();
  PrivatePool(const PrivatePool&) = delete;
  PrivatePool& operator=(const PrivatePool&) = delete;

  DevicePtr take(std::size_t bytes);
  void give_back(DevicePtr p, std::size_t bytes) noexcept;
  std::size_t bytes_held() const { return held_; }
  // The most bytes its blocks held at once (rounded sizes): the floor under bytes_held.
  std::size_t peak_in_use() const;
  int device() const { return device_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int device_;
  void* stream_;
  std::size_t held_ = 0;
};

// While bound, DeviceBuffers allocated on `s` come from `pool`, and DeviceBuffers of the
// driver's pool freed on `s` are parked until unbind (during a capture a free on the stream
// would become a node of the graph). unbind_private_pool recycles what was parked.
// With `hold_frees`, every buffer freed on `s` (private ones too) waits for the unbind: a second
// stream of the capture whose blocks the first must not reuse before it has waited for it.
void bind_private_pool(const Stream& s, std::shared_ptr<PrivatePool> pool, bool hold_frees = false);
void unbind_private_pool(const Stream& s) noexcept;
// The pool bound to `s`, or null.
std::shared_ptr<PrivatePool> bound_private_pool(const Stream& s);

// Owns a stream-ordered allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(std::size_t bytes, const Stream& s);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  DevicePtr ptr() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }
  bool is_private() const { return pool_ != nullptr; }  // carved from a PrivatePool

 private:
  std::shared_ptr<PrivatePool> pool_;
  DevicePtr ptr_ = 0;
  std::size_t bytes_ = 0;
  void* stream_ = nullptr;  // CUstream the buffer is freed on
  int device_ = -1;
};

}  // namespace kiln::rt
