#pragma once
// The quick tier, for cold starts. A kernel a process must compile (its disk cache lacks it) is
// first compiled in NVRTC's fast-compile mode (quick_tier_options), 2-3x cheaper, and runs at
// once; its fully optimised build compiles on the prefetch threads, goes into the disk cache, and
// then replaces the quick one: in later calls, and in instantiated graphs at their next launch
// (the node's function swapped, not recaptured). Quick builds are never stored, so a later
// process loads the full one. With the tier on, KILN_TUNE=auto also measures a problem only once
// its candidates are compiled (tuner.h).
// Off by default: quick builds optimise less and may round differently from full ones (within
// the kernels' tolerances), and a product measured later may run another kernel, so a cold run
// with the tier is not bit for bit a warm run, which kiln otherwise guarantees.
#include <cstdint>

#include "kiln/runtime/scoped_flag.h"

namespace kiln::rt {

struct Function;

// KILN_QUICK_TIER=on|off (off by default). Quick builds also need an NVRTC with the
// fast-compile mode (quick_tier_options() not empty).
bool quick_tier();
void set_quick_tier(bool on);

// While one lives on this thread, its calls get full-tier kernels only, compiling or waiting for
// one where a quick build is loaded: measurements of kernels' speed (KILN_TUNE) need them.
class FullTierOnly : ScopedFlag {
 public:
  FullTierOnly();
};
bool full_tier_only();

// Whether `f` is a quick build (a full one may have replaced it since).
bool is_quick_build(const Function& f);

}  // namespace kiln::rt
