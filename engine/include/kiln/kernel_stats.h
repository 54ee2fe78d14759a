#pragma once
// How this process got its GPU kernels so far: compiled with NVRTC, or loaded from the
// kernel cache (memory or disk). For programs that report it without the runtime headers.
#include <cstdint>

namespace kiln {

struct KernelStats {
  std::uint64_t compiled = 0;
  std::uint64_t loaded_from_disk = 0;
  std::uint64_t memory_hits = 0;
  double compile_ms = 0;
  // Time callers waited for kernels not yet loaded (their own compiles, or prefetches of them).
  double wait_ms = 0;
  // Choices among kernels or algorithms measured on the GPU (KILN_TUNE), and the time that took.
  std::uint64_t tuned = 0;
  double tune_ms = 0;
  // Of `compiled`, quick builds that ran until their full build replaced them (KILN_QUICK_TIER),
  // and the full builds that did.
  std::uint64_t quick_compiled = 0;
  std::uint64_t upgraded = 0;
  // Of `tuned`, the cuBLASLt products prefetch_kernels measured ahead of the run, on its own
  // thread, and the time that took there (off the run's path).
  std::uint64_t tuned_ahead = 0;
  double tune_ahead_ms = 0;
};
KernelStats kernel_stats();

}  // namespace kiln
