#include "kiln/kernel_stats.h"

#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/tuning.h"

namespace kiln {

KernelStats kernel_stats() {
  const rt::CacheCounters c = rt::cache_counters();
  const rt::TuneCounters t = rt::tune_counters();
  return {c.compiles, c.disk_hits,      c.memory_hits, c.compile_ms,     c.wait_ms, t.measured,
          t.ms,       c.quick_compiles, c.upgrades,    t.measured_ahead, t.ahead_ms};
}

}  // namespace kiln
