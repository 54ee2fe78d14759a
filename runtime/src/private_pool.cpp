// Private pools for captured graphs, and the binding of a pool to a stream while it captures.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "arena_space.h"
#include "check.h"
#include "driver.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/log.h"
#include "kiln/runtime/memory.h"
#include "mapped_range.h"
#include "private_binding.h"

namespace kiln::rt {

namespace {

constexpr std::size_t kPoolGranule = 512;
// Where the driver cannot map pages into one range (mapped_range.h), chunks are asked of it in
// whole multiples of its 2 MiB pages: freed space merges within a chunk.
constexpr std::size_t kPoolChunk = 2u << 20;

CUdeviceptr alloc_relaxed(std::size_t bytes) {
  const RelaxedCapture relaxed;
  CUdeviceptr p = 0;
  KILN_CU(cuMemAlloc(&p, bytes));
  return p;
}

// Bytes every private pool of a device holds, for pool_usage.
std::atomic<std::size_t>& held_on(int device) {
  static auto* held = new std::vector<std::atomic<std::size_t>>(static_cast<std::size_t>(std::max(device_count(), 1)));
  return (*held)[static_cast<std::size_t>(device)];
}

}  // namespace

RelaxedCapture::RelaxedCapture() {
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  KILN_CU(cuThreadExchangeStreamCaptureMode(&mode));
  mode_ = static_cast<int>(mode);
}

RelaxedCapture::~RelaxedCapture() {
  auto mode = static_cast<CUstreamCaptureMode>(mode_);
  driver().cuThreadExchangeStreamCaptureMode(&mode);
}

std::size_t private_bytes(int device) { return held_on(device).load(std::memory_order_relaxed); }

struct PrivatePool::Impl {
  std::mutex mu;
  std::unique_ptr<MappedRange> range;  // the arena, where the driver maps pages on demand
  bool range_tried = false, range_full = false;
  std::vector<CUdeviceptr> chunks;  // cuMemAlloc'd where it does not
  ArenaSpace space;

  // Maps what `rounded` lacks at the range's end; false where the range cannot grow.
  bool grow_range(int device, std::size_t rounded, std::size_t& held) {
    if (!range_tried) {
      range_tried = true;
      range = MappedRange::reserve(device);
    }
    if (!range || range_full) return false;
    const bool first = range->mapped() == 0;
    const std::size_t tail = first ? 0 : space.free_at_end(range->base());
    const std::size_t bytes = (rounded - tail + range->page() - 1) / range->page() * range->page();
    if (!range->grow(bytes)) {
      range_full = true;  // its blocks stay in use; later growth takes chunks
      return false;
    }
    if (first)
      space.add_chunk(range->base(), bytes);
    else
      space.extend_chunk(range->base(), bytes);
    held += bytes;
    return true;
  }
};

PrivatePool::PrivatePool(int device, void* stream) : impl_(std::make_unique<Impl>()), device_(device), stream_(stream) {}

PrivatePool::~PrivatePool() {
  try {
    make_current(device_);
    // Work queued on the stream (a replay, or an eager op reading an output) may still use the memory.
    if (stream_) KILN_CU(cuStreamSynchronize(static_cast<CUstream>(stream_)));
    for (CUdeviceptr c : impl_->chunks) KILN_CU(cuMemFree(c));
    impl_->range.reset();
    held_on(device_).fetch_sub(held_, std::memory_order_relaxed);
  } catch (const std::exception& e) {
    log().error("[memory] returning a private pool of {} bytes on cuda:{}: {}", held_, device_, e.what());
  }
}

DevicePtr PrivatePool::take(std::size_t bytes) {
  const std::size_t rounded = std::max(kPoolGranule, (bytes + kPoolGranule - 1) / kPoolGranule * kPoolGranule);
  std::lock_guard lock(impl_->mu);
  if (std::optional<std::uint64_t> p = impl_->space.take(rounded)) return *p;
  make_current(device_);
  const std::size_t before = held_;
  if (!impl_->grow_range(device_, rounded, held_)) {
    const std::size_t size = (rounded + kPoolChunk - 1) / kPoolChunk * kPoolChunk;
    impl_->chunks.push_back(alloc_relaxed(size));
    impl_->space.add_chunk(impl_->chunks.back(), size);
    held_ += size;
  }
  held_on(device_).fetch_add(held_ - before, std::memory_order_relaxed);
  return impl_->space.take(rounded).value();
}

std::size_t PrivatePool::peak_in_use() const {
  std::lock_guard lock(impl_->mu);
  return impl_->space.peak_in_use();
}

void PrivatePool::give_back(DevicePtr p, std::size_t bytes) noexcept {
  if (p == 0) return;
  const std::size_t rounded = std::max(kPoolGranule, (bytes + kPoolGranule - 1) / kPoolGranule * kPoolGranule);
  try {
    std::lock_guard lock(impl_->mu);
    impl_->space.give_back(p, rounded);
  } catch (const std::exception& e) {
    log().error("[memory] returning a private block: {}", e.what());  // the block stays unused
  }
}

// ---- binding ----

namespace {

struct Binding {
  CUstream stream = nullptr;
  std::shared_ptr<PrivatePool> pool;
  std::vector<ParkedFree> parked;
  bool hold_frees = false;
};

struct PoolBindings {
  std::mutex mu;
  std::atomic<int> count{0};
  std::vector<Binding> list;
};

PoolBindings& bindings() {
  static auto* b = new PoolBindings;  // leaked: buffers may be freed during static destruction
  return *b;
}

}  // namespace

void bind_private_pool(const Stream& s, std::shared_ptr<PrivatePool> pool, bool hold_frees) {
  if (!s || !pool) throw ValueError("[memory] bind_private_pool needs a stream and a pool");
  PoolBindings& b = bindings();
  std::lock_guard lock(b.mu);
  for (const Binding& x : b.list)
    if (x.stream == static_cast<CUstream>(s.handle()))
      throw ValueError("[memory] the stream already has a private pool bound (nested capture)");
  b.list.push_back(Binding{static_cast<CUstream>(s.handle()), std::move(pool), {}, hold_frees});
  b.count.fetch_add(1, std::memory_order_release);
}

void unbind_private_pool(const Stream& s) noexcept {
  std::vector<ParkedFree> parked;
  {
    PoolBindings& b = bindings();
    std::lock_guard lock(b.mu);
    auto it = std::find_if(b.list.begin(), b.list.end(),
                           [&](const Binding& x) { return x.stream == static_cast<CUstream>(s.handle()); });
    if (it == b.list.end()) return;
    parked = std::move(it->parked);
    b.list.erase(it);
    b.count.fetch_sub(1, std::memory_order_release);
  }
  for (const ParkedFree& f : parked) {
    if (f.pool)
      f.pool->give_back(f.ptr, f.bytes);
    else
      recycle_block(f.ptr, f.bytes, f.stream, f.device);
  }
}

std::shared_ptr<PrivatePool> bound_private_pool(const Stream& s) { return bound_pool(s.handle()); }

std::shared_ptr<PrivatePool> bound_pool(void* stream) {
  PoolBindings& b = bindings();
  if (b.count.load(std::memory_order_acquire) == 0) return nullptr;
  std::lock_guard lock(b.mu);
  for (const Binding& x : b.list)
    if (x.stream == static_cast<CUstream>(stream)) return x.pool;
  return nullptr;
}

bool park_if_bound(const ParkedFree& f) {
  PoolBindings& b = bindings();
  if (b.count.load(std::memory_order_acquire) == 0) return false;
  try {
    std::lock_guard lock(b.mu);
    for (Binding& x : b.list)
      if (x.stream == static_cast<CUstream>(f.stream)) {
        if (f.pool && !x.hold_frees) return false;
        x.parked.push_back(f);
        return true;
      }
  } catch (const std::exception& e) {
    log().error("[memory] parking a block freed during a capture: {}", e.what());
  }
  return false;
}

}  // namespace kiln::rt
