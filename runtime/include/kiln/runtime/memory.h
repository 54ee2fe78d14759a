#pragma once
// Device memory from the driver's stream-ordered pool (one per device, high
// release threshold) and host<->device copies.
#include <cstddef>
#include <cstdint>

namespace kiln::rt {

class Stream;
using DevicePtr = std::uint64_t;  // CUdeviceptr

// Allocates `bytes` on the stream's device, ordered on `s`. Throws CudaError
// naming the bytes requested and the pool's usage when the pool is exhausted.
DevicePtr device_alloc(std::size_t bytes, const Stream& s);
// Frees in stream order; never throws (errors are logged).
void device_free(DevicePtr p, const Stream& s) noexcept;

struct PoolUsage {
  std::size_t reserved = 0;  // bytes the pool holds from the driver
  std::size_t used = 0;      // bytes handed out, including `cached`
  std::size_t cached = 0;    // freed DeviceBuffer blocks kept for reuse on their stream
};
PoolUsage pool_usage(int device);
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

 private:
  DevicePtr ptr_ = 0;
  std::size_t bytes_ = 0;
  void* stream_ = nullptr;  // CUstream the buffer is freed on
  int device_ = -1;
};

}  // namespace kiln::rt
