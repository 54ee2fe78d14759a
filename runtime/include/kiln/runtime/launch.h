#pragma once
// Launches a cached function with typed arguments on a stream.
#include <cstdint>

#include "module_cache.h"

namespace kiln::rt {

class Stream;

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

struct LaunchConfig {
  Dim3 grid;
  Dim3 block;
  unsigned shared_bytes = 0;
};

// A function whose module waits for prior grids (Function::waits_for_prior_grids) is launched
// with programmatic stream serialization while programmatic_launch() holds: its launch overlaps
// the end of the kernel before it, and it waits in its first statement for that kernel's
// completion and writes. Captured, the graph's edge between the two is programmatic.
void launch_raw(const Function& f, const LaunchConfig& c, const Stream& s, void** args);

// Programmatic dependent launch on or off for every later launch (KILN_PDL=on|off; on by default).
bool programmatic_launch();
void set_programmatic_launch(bool on);

// Each argument is passed by address, as cuLaunchKernel expects; types must match
// the kernel's parameters exactly (DevicePtr for pointers).
template <class... Args>
void launch(const Function& f, const LaunchConfig& c, const Stream& s, const Args&... args) {
  void* params[] = {const_cast<void*>(static_cast<const void*>(&args))..., nullptr};
  launch_raw(f, c, s, params);
}

// Blocks of c.block.x threads with c.shared_bytes of dynamic shared memory that one SM keeps
// resident at once (the driver's occupancy for f), asked once per function and shape;
// `fallback` in a shape-only pass, which loads no kernel.
int resident_blocks(const Function& f, const LaunchConfig& c, int fallback);

// Blocks of `block` threads covering n items, capped for grid-stride loops.
LaunchConfig linear_config(std::uint64_t n, unsigned block = 256, unsigned max_blocks = 65535u * 4);

}  // namespace kiln::rt
