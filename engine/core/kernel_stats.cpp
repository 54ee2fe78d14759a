#include "kiln/kernel_stats.h"

#include "kiln/runtime/module_cache.h"

namespace kiln {

KernelStats kernel_stats() {
  const rt::CacheCounters c = rt::cache_counters();
  return {c.compiles, c.disk_hits, c.memory_hits, c.compile_ms, c.wait_ms};
}

}  // namespace kiln
