#pragma once
// What module_cache.cpp shares with kernel_bundle.cpp: the disk cache keys of kernels and the
// cache's counters.
#include <cstdint>
#include <string>

#include "kiln/dtype.h"
#include "kiln/runtime/disk_cache.h"

namespace kiln::rt {

struct KernelSpec;

// The key of (spec, dtypes, variant) compiled for `arch` from `source`, its instantiation.
EntryKey kernel_entry_key(const KernelSpec& spec, const DTypes& d, std::uint32_t variant, int arch,
                          const std::string& source);
// `named` carries op, dtypes, variant and label; the rest follows from the arch and NVRTC.
EntryKey entry_key_for_arch(EntryKey named, int arch, const std::string& source);

// CacheCounters' compiles and compile_ms, and disk_hits.
void count_compile(double ms);
void count_disk_hit();

}  // namespace kiln::rt
