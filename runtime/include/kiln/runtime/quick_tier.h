#pragma once
// The quick tier. A kernel a process must compile (its disk cache lacks it) is first compiled
// in NVRTC's fast-compile mode (quick_tier_options), 2-3x cheaper, and runs at once; its fully
// optimised build compiles on the prefetch threads, goes into the disk cache, and then replaces
// the quick one: in later calls, and in instantiated graphs at their next launch (the node's
// function swapped, not recaptured). Quick builds are never stored, so a later process loads
// the full one. They optimise less, so their sums may round differently from the full build's,
// within the kernels' stated tolerances.
#include <cstdint>

namespace kiln::rt {

struct Function;

// KILN_QUICK_TIER=on|off (on by default), and an NVRTC that has the fast-compile mode.
bool quick_tier();
void set_quick_tier(bool on);

// While one lives on this thread, its calls get full-tier kernels only, compiling or waiting for
// one where a quick build is loaded: measurements of kernels' speed (KILN_TUNE) need them.
class FullTierOnly {
 public:
  FullTierOnly();
  ~FullTierOnly();
  FullTierOnly(const FullTierOnly&) = delete;
  FullTierOnly& operator=(const FullTierOnly&) = delete;

 private:
  bool was_;
};
bool full_tier_only();

// Whether `f` is a quick build (a full one may have replaced it since).
bool is_quick_build(const Function& f);

}  // namespace kiln::rt
