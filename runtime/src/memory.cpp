#include "kiln/runtime/memory.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "check.h"
#include "driver.h"
#include "kiln/error.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/log.h"

namespace kiln::rt {

namespace {

constexpr std::size_t kChunk = 8u << 20;  // bytes per pinned staging buffer
constexpr std::size_t kRingSize = 4;

// A pinned buffer and the event recorded after the last copy that used it.
struct StagingSlot {
  void* host = nullptr;
  CUevent done = nullptr;
};

// Staging buffers used by one copy at a time; several rings exist when copies run concurrently.
struct Ring {
  std::array<StagingSlot, kRingSize> slots;
  std::size_t next = 0;

  // The next buffer in rotation, allocated on first use (the device's context is current).
  StagingSlot& take() {
    StagingSlot& s = slots[next++ % kRingSize];
    if (!s.host) {
      KILN_CU(cuEventCreate(&s.done, CU_EVENT_DISABLE_TIMING));
      KILN_CU(cuMemHostAlloc(&s.host, kChunk, 0));
    }
    return s;
  }
};

struct PoolState {
  std::mutex mu;
  std::atomic<bool> ready{false};
  CUmemoryPool pool = nullptr;
  std::vector<Ring*> free_rings;
};

// Leaked on purpose, like the default streams: pinned buffers and events live for the process.
PoolState& state(int device) {
  device_info(device);  // throws DeviceError (no GPU, or no such ordinal)
  static auto* states = new std::vector<PoolState>(static_cast<std::size_t>(device_count()));
  PoolState& st = (*states)[device];
  if (!st.ready.load(std::memory_order_acquire)) {
    std::lock_guard lock(st.mu);
    if (!st.ready.load(std::memory_order_relaxed)) {
      CUdevice dev = 0;
      KILN_CU(cuDeviceGet(&dev, device));
      KILN_CU(cuDeviceGetDefaultMemPool(&st.pool, dev));
      // The pool keeps freed memory instead of returning it at each synchronization.
      cuuint64_t threshold = UINT64_MAX;
      KILN_CU(cuMemPoolSetAttribute(st.pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
      st.ready.store(true, std::memory_order_release);
    }
  }
  return st;
}

// Exclusive use of one ring. A ring is returned only after a copy completed without
// error: after a failure an async copy may still be writing into one of its buffers.
class RingLease {
 public:
  explicit RingLease(PoolState& st) : st_(st) {
    std::lock_guard lock(st_.mu);
    if (st_.free_rings.empty()) {
      ring_ = new Ring;
    } else {
      ring_ = st_.free_rings.back();
      st_.free_rings.pop_back();
    }
  }
  ~RingLease() {
    if (!ok_) {
      log().warn("[memory] a staged copy failed; its pinned staging buffers are abandoned");
      return;
    }
    std::lock_guard lock(st_.mu);
    st_.free_rings.push_back(ring_);
  }
  RingLease(const RingLease&) = delete;
  RingLease& operator=(const RingLease&) = delete;

  Ring& ring() { return *ring_; }
  void succeeded() { ok_ = true; }

 private:
  PoolState& st_;
  Ring* ring_ = nullptr;
  bool ok_ = false;
};

CUstream stream_of(const Stream& s, const char* op) {
  if (!s) {
    driver();  // without a GPU, say why rather than "empty"
    throw DeviceError(std::string("[memory] ") + op + " needs a stream; this one is empty");
  }
  return static_cast<CUstream>(s.handle());
}

void require_ptr(DevicePtr p, std::size_t bytes, const char* op) {
  if (p == 0) throw ValueError(std::string("[memory] ") + op + ": null device pointer for " + std::to_string(bytes) + " bytes");
}

PoolUsage usage_of(CUmemoryPool pool) {
  cuuint64_t reserved = 0, used = 0;
  KILN_CU(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
  KILN_CU(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used));
  return {static_cast<std::size_t>(reserved), static_cast<std::size_t>(used)};
}

void free_on(DevicePtr p, CUstream stream, int device) noexcept {
  if (p == 0) return;
  try {
    if (!stream) throw DeviceError("[memory] device_free needs a stream; this one is empty");
    make_current(device);
    KILN_CU(cuMemFreeAsync(p, stream));
  } catch (const std::exception& e) {
    log().error("[memory] freeing {:#x} on cuda:{}: {}", p, device, e.what());
  }
}

}  // namespace

DevicePtr device_alloc(std::size_t bytes, const Stream& s) {
  if (bytes == 0) return 0;
  CUstream stream = stream_of(s, "device_alloc");
  PoolState& st = state(s.device());
  make_current(s.device());
  CUdeviceptr p = 0;
  CUresult r = driver().cuMemAllocFromPoolAsync(&p, bytes, st.pool, stream);
  if (r == CUDA_SUCCESS) return p;

  const char* name = nullptr;
  const char* msg = nullptr;
  driver().cuGetErrorName(r, &name);
  driver().cuGetErrorString(r, &msg);
  std::string detail = std::string(msg ? msg : "unknown error") + "; requested " + std::to_string(bytes) +
                       " bytes on cuda:" + std::to_string(s.device());
  try {
    PoolUsage u = usage_of(st.pool);
    detail += ", pool reserved " + std::to_string(u.reserved) + " bytes, used " + std::to_string(u.used) + " bytes";
  } catch (const CudaError&) {
    detail += ", pool usage unavailable";
  }
  throw CudaError("cuMemAllocFromPoolAsync(&p, bytes, pool, stream)", name ? name : "CUresult " + std::to_string(r),
                  detail, __FILE__, __LINE__);
}

void device_free(DevicePtr p, const Stream& s) noexcept {
  free_on(p, static_cast<CUstream>(s.handle()), s.device());
}

PoolUsage pool_usage(int device) { return usage_of(state(device).pool); }

void copy_to_device(DevicePtr dst, const void* src, std::size_t bytes, const Stream& s) {
  if (bytes == 0) return;
  CUstream stream = stream_of(s, "copy_to_device");
  require_ptr(dst, bytes, "copy_to_device");
  PoolState& st = state(s.device());
  make_current(s.device());
  RingLease lease(st);
  const auto* in = static_cast<const std::byte*>(src);
  for (std::size_t off = 0; off < bytes; off += kChunk) {
    std::size_t n = std::min(kChunk, bytes - off);
    StagingSlot& slot = lease.ring().take();
    KILN_CU(cuEventSynchronize(slot.done));  // its previous copy has left the buffer
    std::memcpy(slot.host, in + off, n);
    KILN_CU(cuMemcpyHtoDAsync(dst + off, slot.host, n, stream));
    KILN_CU(cuEventRecord(slot.done, stream));
  }
  lease.succeeded();
}

void copy_to_host(void* dst, DevicePtr src, std::size_t bytes, const Stream& s) {
  if (bytes == 0) return;
  CUstream stream = stream_of(s, "copy_to_host");
  require_ptr(src, bytes, "copy_to_host");
  PoolState& st = state(s.device());
  make_current(s.device());
  RingLease lease(st);
  auto* out = static_cast<std::byte*>(dst);
  std::size_t chunks = (bytes + kChunk - 1) / kChunk;
  // Two chunks in flight: the GPU fills one buffer while the host drains the other.
  constexpr std::size_t kInFlight = 2;
  std::array<StagingSlot*, kInFlight> pending{};
  auto drain = [&](std::size_t chunk) {
    StagingSlot& slot = *pending[chunk % kInFlight];
    std::size_t off = chunk * kChunk;
    KILN_CU(cuEventSynchronize(slot.done));
    std::memcpy(out + off, slot.host, std::min(kChunk, bytes - off));
  };
  for (std::size_t i = 0; i < chunks; ++i) {
    if (i >= kInFlight) drain(i - kInFlight);
    StagingSlot& slot = lease.ring().take();
    KILN_CU(cuEventSynchronize(slot.done));  // an earlier copy_to_device may still read it
    std::size_t off = i * kChunk;
    KILN_CU(cuMemcpyDtoHAsync(slot.host, src + off, std::min(kChunk, bytes - off), stream));
    KILN_CU(cuEventRecord(slot.done, stream));
    pending[i % kInFlight] = &slot;
  }
  for (std::size_t i = chunks > kInFlight ? chunks - kInFlight : 0; i < chunks; ++i) drain(i);
  lease.succeeded();
}

void copy_device(DevicePtr dst, DevicePtr src, std::size_t bytes, const Stream& s) {
  if (bytes == 0) return;
  CUstream stream = stream_of(s, "copy_device");
  require_ptr(dst, bytes, "copy_device");
  require_ptr(src, bytes, "copy_device");
  make_current(s.device());
  KILN_CU(cuMemcpyDtoDAsync(dst, src, bytes, stream));
}

void memset_device(DevicePtr dst, std::uint8_t value, std::size_t bytes, const Stream& s) {
  if (bytes == 0) return;
  CUstream stream = stream_of(s, "memset_device");
  require_ptr(dst, bytes, "memset_device");
  make_current(s.device());
  KILN_CU(cuMemsetD8Async(dst, value, bytes, stream));
}

// ---- DeviceBuffer ----

DeviceBuffer::DeviceBuffer(std::size_t bytes, const Stream& s)
    : ptr_(device_alloc(bytes, s)), bytes_(bytes), stream_(s.handle()), device_(s.device()) {}

DeviceBuffer::~DeviceBuffer() { free_on(ptr_, static_cast<CUstream>(stream_), device_); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, 0)),
      bytes_(std::exchange(o.bytes_, 0)),
      stream_(std::exchange(o.stream_, nullptr)),
      device_(std::exchange(o.device_, -1)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    free_on(ptr_, static_cast<CUstream>(stream_), device_);
    ptr_ = std::exchange(o.ptr_, 0);
    bytes_ = std::exchange(o.bytes_, 0);
    stream_ = std::exchange(o.stream_, nullptr);
    device_ = std::exchange(o.device_, -1);
  }
  return *this;
}

}  // namespace kiln::rt
