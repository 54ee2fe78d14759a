#pragma once
// What a run will need, loaded before it asks: a shape-only pass lists the kernels a piece of
// work picks without running it, and prefetch compiles and loads such a list on background
// threads, so a cold process compiles in parallel instead of one kernel per first call.
#include <cstdint>
#include <functional>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/runtime/disk_cache.h"
#include "kiln/runtime/scoped_flag.h"

namespace kiln::rt {

struct KernelSpec;

// One kernel a shape-only pass asked for.
struct KernelRequest {
  const KernelSpec* spec = nullptr;
  DTypes dtypes;
  std::uint32_t variant = 0;
  int device = 0;
  // Asked for only inside a LateRequests scope: an alternative a run may never launch, which a
  // prefetch compiles as its full build alone (no quick build first), and with the quick tier on
  // after everything else.
  bool late = false;
};

// While one lives on this thread, stream work is skipped: launches, copies, fills and library
// calls do nothing (copies to the host write zeros), while ops still check their arguments,
// allocate their outputs and pick their kernels; get_function records each kernel instead of
// loading it. Nothing in it needs a CUDA context: default_stream is an unbacked stream,
// device_alloc hands out planned addresses (is_planned), tensor maps are left unencoded.
// Passes do not nest.
class ShapeOnlyPass {
 public:
  ShapeOnlyPass();
  ~ShapeOnlyPass();
  ShapeOnlyPass(const ShapeOnlyPass&) = delete;
  ShapeOnlyPass& operator=(const ShapeOnlyPass&) = delete;

  // Each kernel once, in the order first asked for; `late` where it was asked for only inside a
  // LateRequests scope.
  const std::vector<KernelRequest>& requests() const { return requests_; }

 private:
  friend void record_request(const KernelSpec&, const DTypes&, std::uint32_t, int);
  std::vector<KernelRequest> requests_;
};

// While one lives on this thread, a pass marks the kernels asked for late: the tuner's
// alternatives to its first pick, which a run may never launch. With the quick tier (which lets
// a run go on without measuring them) a prefetch compiles them after everything else.
class LateRequests : ScopedFlag {
 public:
  LateRequests();
};

// This thread is inside a ShapeOnlyPass.
bool shape_only();
// get_function's side of a pass.
void record_request(const KernelSpec& spec, const DTypes& dtypes, std::uint32_t variant, int device);

// Loads the requests on `threads` background threads (0: background_compile_jobs()), compiling
// what the disk cache lacks, and returns at once; in the requests' order, late ones as full
// builds alone (FullTierOnly) and, with the quick tier on, after everything else queued. A get_function of a kernel
// still loading waits for that load; one that failed is tried again there, which throws its error.
void prefetch(std::vector<KernelRequest> requests, int threads = 0);
// A generated kernel recorded by another process: compiled for `arch` into the disk cache
// (warm_source), where the first use of its module finds it.
struct SourceRequest {
  EntryKey key;  // op, dtypes, variant and label as recorded
  std::string source;
  int arch = 0;
};
void prefetch_sources(std::vector<SourceRequest> sources, int threads = 0);

// Runs `job` on the prefetch threads: after the requests queued for a run (kernels it launches),
// before late ones (alternatives it may never launch), and with `ahead` before other such jobs.
// A kernel's full build is such a job, and one still queued at exit runs before the exit.
void run_in_background(std::function<void()> job, bool ahead = false);

// This thread is one of prefetch's workers (whose waits CacheCounters::wait_ms leaves out).
bool on_prefetch_thread();
// Blocks until every prefetched kernel has loaded or failed.
void wait_for_prefetch();
// Blocks until `done()` holds or nothing prefetched is left to load (a graph capture waits so
// for a kernel a prefetch thread still loads: it cannot load one itself).
void wait_for_prefetch_until(const std::function<bool()>& done);

}  // namespace kiln::rt
