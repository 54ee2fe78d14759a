// doctest main shared by every suite. The GPU suite exits 77 (ctest: skipped)
// when no GPU is usable, printing why, so a machine without one shows the skip, and runs
// the CPU side of its comparisons on the ops' reference loops (OpDef::cpu_reference).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "kiln/runtime/device.h"
#ifdef KILN_GPU_SUITE
#include "core/registry.h"
#endif

int main(int argc, char** argv) {
#ifdef KILN_GPU_SUITE
  std::string why;
  if (!kiln::rt::gpu_available(&why)) {
    std::printf("SKIPPED: GPU tests need a GPU: %s\n", why.c_str());
    return 77;
  }
  // GPU results are compared with the independent CPU loops, not the CPU fast paths.
  kiln::use_cpu_reference(true);
#endif
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
