#pragma once
// What the three kinds of `jitcc warm` share (registered kernels, --from-cache, --plan):
// compiling a list of kernels into the cache on several threads, and the summary of it.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "cli.h"
#include "kiln/runtime/kernel_bundle.h"
#include "kiln/runtime/module_cache.h"

namespace jitcc {

// --jobs (0: rt::compile_jobs(), KILN_COMPILE_JOBS or the usable CPUs up to 16), at most one per kernel.
int warm_threads(int jobs, std::size_t kernels);
// The process-wide cache warm fills, with a warning when KILN_CACHE is not rw.
kiln::rt::DiskCache& open_warm_cache();
std::string first_line(const std::string& s);
// What warm calls a kernel: a generated kernel's label, else "op (dtypes) variant N".
std::string kernel_name(const std::string& op, const std::string& dtypes, std::uint32_t variant,
                        const std::string& label = "");

struct WarmBatch {
  std::vector<std::string> outcomes;      // "compiled" or "cached"; empty for a kernel that failed
  std::vector<std::string> digests;       // empty for a kernel that failed
  std::vector<std::string> errors, logs;  // a failed kernel's first line of error, and NVRTC's log
  std::vector<double> ms;  // a compiled kernel's compile (NVRTC in its server, and the store), on its thread; else 0
  int compiled = 0, cached = 0, failed = 0, threads = 0;
  double seconds = 0;
  std::size_t stored = 0;  // of the built kernels, how many the cache holds at the end
};

// warm_group(group) for each group of the n kernels (indices; every kernel in one group) on
// `threads` threads, groups in their order, under a progress line; then a count of what reached
// the cache (warning when some did not). warm_group gives a result per kernel of its group.
using WarmGroup = std::function<std::vector<kiln::rt::BundleResult>(std::span<const std::size_t>)>;
WarmBatch warm_groups(std::size_t n, const std::vector<std::vector<std::size_t>>& groups, int threads,
                      const Common& common, const kiln::rt::DiskCache& cache, const WarmGroup& warm_group);

// One kernel's warm as a group's result: warm(&digest)'s outcome and time, or what it threw.
kiln::rt::BundleResult warm_result(const std::function<kiln::rt::WarmOutcome(std::string*)>& warm);

// warm_one(i, &digest) for each of n kernels on `threads` threads under a progress line, then
// a count of what reached the cache (warning when some did not).
WarmBatch warm_batch(std::size_t n, int threads, const Common& common, const kiln::rt::DiskCache& cache,
                     const std::function<kiln::rt::WarmOutcome(std::size_t, std::string*)>& warm_one);

// A kernel's family: a registered kernel's template, a generated one's module kind
// ("gemm_wgmma" of "gemm_wgmma_<16 hex digits>").
std::string kernel_family(const std::string& op);

// The fields every warm's JSON summary has, after `head` (what was warmed from); `families`
// holds each kernel's family, for "families": the compiled kernels' milliseconds per family
// ({family, compiled, median_ms, max_ms, total_ms}), the costliest first.
Json warm_summary(Json head, const WarmBatch& b, int arch, const kiln::rt::DiskCache& cache,
                  const std::vector<std::string>& families);
// warm --timings: the summary's "families" as a table.
std::string family_table(const Json& families);
// "N compiled, N already cached, N failed (N threads)", with `failed` counting other failures too.
std::string warm_counts(const WarmBatch& b, std::size_t failed);
// 0, or kFailureExit when a kernel failed or (without --allow-unstored) was not stored.
int warm_exit(const WarmBatch& b, std::size_t failed, bool allow_unstored);

// Kernels an NVRTC program holds at most (rt::bundle_groups). NVRTC pays much per program:
// on the 16-core H200 host a full warm took 8.9-11.3 s bundled against 10.2-11.7 s alone.
constexpr int kDefaultBundle = 8;

// jitcc warm --from-cache DIR (cmd_warm_from_cache.cpp) and --plan FILE (cmd_warm_plan.cpp).
// --arch, --jobs (0: rt::compile_jobs()), --bundle, --allow-unstored and --timings of every warm.
struct WarmOptions {
  std::string arch;
  int jobs = 0;
  bool allow_unstored = false, timings = false;
  int bundle = kDefaultBundle;  // --bundle: kiln's own kernels a program holds at most
};
int run_warm_from_cache(const std::string& dir, const WarmOptions& o, const Common& common);
int run_warm_plan(const std::string& file, const WarmOptions& o, const Common& common);

}  // namespace jitcc
