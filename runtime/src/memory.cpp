#include "kiln/runtime/memory.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "check.h"
#include "driver.h"
#include "kiln/error.h"
#include "memory_cache.h"
#include "private_binding.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/kernel_plan.h"
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

// Freed blocks parked per stream, reused by the next allocation of the same rounded size on
// that stream: stream order makes this safe without events, and a hit skips the driver's
// alloc and free calls, which dominated the host time of a small op.
constexpr std::size_t kGranule = 512;
constexpr std::size_t kMaxCachedBlock = 64u << 20;
constexpr std::size_t kMaxCachedBytes = std::size_t{1} << 30;  // per device

struct StreamBlocks {
  CUstream stream = nullptr;
  std::unordered_map<std::size_t, std::vector<DevicePtr>> bins;  // by rounded size
};

struct BlockCache {
  std::mutex mu;
  std::vector<StreamBlocks> streams;  // few: usually the device's default stream only
  std::size_t bytes = 0;
};

struct PoolState {
  std::mutex mu;
  std::atomic<bool> ready{false};
  CUmemoryPool pool = nullptr;
  std::vector<Ring*> free_rings;
  BlockCache cache;
};

std::size_t cached_size(std::size_t bytes) { return (bytes + kGranule - 1) / kGranule * kGranule; }

// A shape-only pass allocates addresses, not memory, granule-aligned like the pool's blocks so
// ops pick the kernels the same alignment gets them in a real run. Nothing reads or frees them.
std::atomic<DevicePtr> g_planned_next{kPlannedAddresses};

DevicePtr planned_alloc(std::size_t bytes, int device) {
  device_info(device);  // throws DeviceError (no GPU, or no such ordinal) as a real one does
  return g_planned_next.fetch_add(cached_size(bytes) + kGranule);
}

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

DevicePtr take_cached(BlockCache& c, CUstream stream, std::size_t rounded) {
  std::lock_guard lock(c.mu);
  for (StreamBlocks& sb : c.streams) {
    if (sb.stream != stream) continue;
    auto it = sb.bins.find(rounded);
    if (it == sb.bins.end() || it->second.empty()) return 0;
    DevicePtr p = it->second.back();
    it->second.pop_back();
    c.bytes -= rounded;
    return p;
  }
  return 0;
}

// Parks a block of `bytes` (as requested) freed on `stream`; false when it must go to the pool.
bool park(BlockCache& c, DevicePtr p, std::size_t bytes, CUstream stream) {
  const std::size_t rounded = cached_size(bytes);
  if (rounded > kMaxCachedBlock) return false;
  std::lock_guard lock(c.mu);
  if (c.bytes + rounded > kMaxCachedBytes) return false;
  auto sb = std::find_if(c.streams.begin(), c.streams.end(), [&](const StreamBlocks& b) { return b.stream == stream; });
  if (sb == c.streams.end()) sb = c.streams.insert(c.streams.end(), StreamBlocks{stream, {}});
  sb->bins[rounded].push_back(p);
  c.bytes += rounded;
  return true;
}

// Frees the parked blocks of `stream` (every stream when null) to the pool and returns the
// streams they were freed on.
std::vector<CUstream> release_cached(BlockCache& c, int device, CUstream stream = nullptr) {
  std::lock_guard lock(c.mu);
  std::vector<CUstream> freed_on;
  for (auto it = c.streams.begin(); it != c.streams.end();) {
    if (stream && it->stream != stream) {
      ++it;
      continue;
    }
    bool any = false;
    for (auto& [rounded, blocks] : it->bins) {
      for (DevicePtr p : blocks) free_on(p, it->stream, device);
      c.bytes -= rounded * blocks.size();
      any = any || !blocks.empty();
    }
    if (any) freed_on.push_back(it->stream);
    it = c.streams.erase(it);
  }
  return freed_on;
}

}  // namespace

void recycle_block(DevicePtr p, std::size_t bytes, void* stream, int device) noexcept {
  if (p == 0) return;
  try {
    if (stream && park(state(device).cache, p, bytes, static_cast<CUstream>(stream))) return;
  } catch (const std::exception& e) {
    log().error("[memory] caching {:#x} on cuda:{}: {}", p, device, e.what());
  }
  free_on(p, static_cast<CUstream>(stream), device);
}

namespace {

void release(DevicePtr p, std::size_t bytes, void* stream, int device, const std::shared_ptr<PrivatePool>& pool) noexcept {
  if (p == 0 || is_planned(p)) return;
  if (park_if_bound(ParkedFree{p, bytes, stream, device, pool})) return;
  if (pool) return pool->give_back(p, bytes);
  recycle_block(p, bytes, stream, device);
}

// Refuses host-synchronous copies on a stream that is being captured: they cannot be graph nodes.
void require_not_capturing(CUstream stream, const char* op) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  KILN_CU(cuStreamIsCapturing(stream, &status));
  if (status != CU_STREAM_CAPTURE_STATUS_NONE)
    throw DeviceError(std::string("[memory] ") + op + " needs the host and cannot run while its stream is captured into a graph");
}

}  // namespace

DevicePtr device_alloc(std::size_t bytes, const Stream& s) {
  if (bytes == 0) return 0;
  CUstream stream = stream_of(s, "device_alloc");
  if (shape_only()) return planned_alloc(bytes, s.device());
  PoolState& st = state(s.device());
  // A cacheable block is allocated at its rounded size so it can serve any request of that size.
  std::size_t block = cached_size(bytes);
  if (block <= kMaxCachedBlock) {
    if (DevicePtr p = take_cached(st.cache, stream, block)) return p;
  } else {
    block = bytes;
  }
  make_current(s.device());
  CUdeviceptr p = 0;
  CUresult r = driver().cuMemAllocFromPoolAsync(&p, block, st.pool, stream);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    const std::vector<CUstream> freed_on = release_cached(st.cache, s.device());
    // Blocks freed on another stream serve this one only once that stream has passed the free.
    for (CUstream other : freed_on) KILN_CU(cuStreamSynchronize(other));
    if (!freed_on.empty()) r = driver().cuMemAllocFromPoolAsync(&p, block, st.pool, stream);
  }
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
  if (is_planned(p)) return;
  free_on(p, static_cast<CUstream>(s.handle()), s.device());
}

PoolUsage pool_usage(int device) {
  if (shape_only()) {  // nothing is allocated for real (and a pass opens no context to ask)
    device_info(device);
    return {};
  }
  PoolState& st = state(device);
  PoolUsage u = usage_of(st.pool);
  std::lock_guard lock(st.cache.mu);
  u.cached = st.cache.bytes;
  u.private_bytes = private_bytes(device);
  return u;
}

void release_cached_blocks(int device) { release_cached(state(device).cache, device); }

void release_stream_blocks(int device, void* stream) noexcept {
  if (!stream || device < 0) return;
  try {
    release_cached(state(device).cache, device, static_cast<CUstream>(stream));
  } catch (const std::exception& e) {
    log().error("[memory] releasing the cached blocks of a stream on cuda:{}: {}", device, e.what());
  }
}

void copy_to_device(DevicePtr dst, const void* src, std::size_t bytes, const Stream& s) {
  if (bytes == 0) return;
  CUstream stream = stream_of(s, "copy_to_device");
  require_ptr(dst, bytes, "copy_to_device");
  if (shape_only()) return;
  require_not_capturing(stream, "copy_to_device");
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
  if (shape_only()) {  // what a shape-only pass reads is zeros, not whatever the memory held
    std::memset(dst, 0, bytes);
    return;
  }
  require_not_capturing(stream, "copy_to_host");
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
  if (shape_only()) return;
  make_current(s.device());
  KILN_CU(cuMemcpyDtoDAsync(dst, src, bytes, stream));
}

void memset_device(DevicePtr dst, std::uint8_t value, std::size_t bytes, const Stream& s) {
  if (bytes == 0) return;
  CUstream stream = stream_of(s, "memset_device");
  require_ptr(dst, bytes, "memset_device");
  if (shape_only()) return;
  make_current(s.device());
  KILN_CU(cuMemsetD8Async(dst, value, bytes, stream));
}

// ---- DeviceBuffer ----

DeviceBuffer::DeviceBuffer(std::size_t bytes, const Stream& s)
    : pool_(bytes ? bound_pool(s.handle()) : nullptr), bytes_(bytes), stream_(s.handle()), device_(s.device()) {
  ptr_ = pool_ ? pool_->take(bytes) : device_alloc(bytes, s);
}

DeviceBuffer::~DeviceBuffer() { release(ptr_, bytes_, stream_, device_, pool_); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : pool_(std::move(o.pool_)),
      ptr_(std::exchange(o.ptr_, 0)),
      bytes_(std::exchange(o.bytes_, 0)),
      stream_(std::exchange(o.stream_, nullptr)),
      device_(std::exchange(o.device_, -1)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    release(ptr_, bytes_, stream_, device_, pool_);
    pool_ = std::move(o.pool_);
    ptr_ = std::exchange(o.ptr_, 0);
    bytes_ = std::exchange(o.bytes_, 0);
    stream_ = std::exchange(o.stream_, nullptr);
    device_ = std::exchange(o.device_, -1);
  }
  return *this;
}

}  // namespace kiln::rt
