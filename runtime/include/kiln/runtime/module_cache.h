#pragma once
// Two-level module cache: memory (op, dtypes, variant, device) -> loaded function,
// backed by the disk cache. A memory hit builds no strings and hashes no source.
#include <cstdint>
#include <optional>
#include <string>

#include "kiln/dtype.h"
#include "kiln/runtime/scoped_flag.h"

namespace kiln::rt {

struct KernelSpec;
struct EntryKey;
struct Entry;

struct Function {
  void* handle = nullptr;  // CUfunction
  int device = -1;
  // Its module states that every kernel in it waits for the kernel before it on the stream
  // (kiln::wait_prior_grids in the prelude) and the device is sm_90 or later: launch() may
  // launch it before that kernel has finished (programmatic dependent launch).
  bool waits_for_prior_grids = false;
};

// The loaded function for (spec, dtypes, variant) on `device`: a memory hit, else a
// disk hit, else an NVRTC compile (a quick build first, quick_tier.h, where that is on).
// Concurrent first calls of one key compile once.
Function get_function(const KernelSpec& spec, const DTypes& dtypes, std::uint32_t variant, int device);

// The function's full build if it is loaded, or loaded from the disk cache when `look_on_disk`
// and an entry is there; nullopt where it would take a compile (none is started).
std::optional<Function> function_if_cached(const KernelSpec& spec, const DTypes& dtypes, std::uint32_t variant,
                                           int device, bool look_on_disk = true);

enum class WarmOutcome { compiled, cached };
// Fills the disk cache for `arch` without a GPU. Throws CompileError on failure. `digest`
// receives the entry's name, so a caller can check that the store took.
WarmOutcome warm_kernel(const KernelSpec& spec, const DTypes& dtypes, std::uint32_t variant, int arch,
                        std::string* digest = nullptr);

// Compiles a source recorded in a cache entry (its op, dtypes, variant and label kept) for
// `arch` into the disk cache, unless already there: a generated kernel has no spec to warm.
WarmOutcome warm_source(const EntryKey& recorded, const std::string& source, int arch,
                        std::string* digest = nullptr);

// The disk cache's entry for (spec, dtypes, variant) compiled for `arch`, without a GPU: read
// back when there (the key hashes the source, every NVRTC option, NVRTC's version and the
// arch), else compiled and stored. Throws CompileError. `outcome`, when given, says which.
Entry cached_entry(const KernelSpec& spec, const DTypes& dtypes, std::uint32_t variant, int arch,
                   WarmOutcome* outcome = nullptr);

struct CacheCounters {
  std::uint64_t compiles = 0;
  std::uint64_t memory_hits = 0;
  std::uint64_t disk_hits = 0;
  double compile_ms = 0;
  double load_ms = 0;  // cuModuleLoadData time
  std::uint64_t cubin_loads = 0;  // modules loaded from CUBIN
  std::uint64_t ptx_loads = 0;    // modules the driver had to JIT from PTX (fallback)
  // Time get_function callers spent blocked on a kernel not yet loaded: their own compile or
  // load, or a prefetch of it still running (prefetch threads' own time not counted).
  double wait_ms = 0;
  std::uint64_t quick_compiles = 0;  // of `compiles`, quick builds (quick_tier.h), never stored
  std::uint64_t upgrades = 0;        // full builds that replaced a quick one
};
CacheCounters cache_counters();
void reset_cache_counters();

// While one lives on this thread, its kernel waits are left out of CacheCounters::wait_ms, as
// the prefetch threads' are: the thread works beside the run (measuring ahead of it), so its
// waits are not the run's.
class UncountedWaits : ScopedFlag {
 public:
  UncountedWaits();
};

}  // namespace kiln::rt
