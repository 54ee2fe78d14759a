#include "host_blocks.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

namespace kiln::cpu {

namespace {

// Below this, malloc's own free lists already reuse memory without faults.
constexpr std::size_t kMinCached = std::size_t{256} << 10;
// What the cache may hold at once; a block that would exceed it goes back to the system.
constexpr std::size_t kMaxCachedBytes = std::size_t{1} << 30;

std::size_t rounded(std::size_t bytes) { return (bytes + 63) / 64 * 64; }

struct Cache {
  std::mutex mu;
  std::multimap<std::size_t, void*> free;  // rounded size -> block
  std::size_t bytes = 0;
};

Cache& cache() {
  static auto* c = new Cache;  // leaked: tensors may be freed during static destruction
  return *c;
}

}  // namespace

void* host_alloc(std::size_t bytes) {
  const std::size_t size = rounded(bytes);
  if (size >= kMinCached) {
    Cache& c = cache();
    std::lock_guard lock(c.mu);
    if (auto it = c.free.find(size); it != c.free.end()) {
      void* p = it->second;
      c.free.erase(it);
      c.bytes -= size;
      return p;
    }
  }
  void* p = std::aligned_alloc(64, size);
  if (!p) throw std::bad_alloc();
  return p;
}

void host_free(void* p, std::size_t bytes) noexcept {
  if (!p) return;
  const std::size_t size = rounded(bytes);
  if (size >= kMinCached) {
    Cache& c = cache();
    std::lock_guard lock(c.mu);
    if (c.bytes + size <= kMaxCachedBytes) {
      try {
        c.free.emplace(size, p);
        c.bytes += size;
        return;
      } catch (...) {  // no room for the node: the block goes back instead
      }
    }
  }
  std::free(p);
}

}  // namespace kiln::cpu
