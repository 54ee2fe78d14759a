// doctest main shared by every suite. The GPU suite exits 77 (ctest: skipped)
// when no GPU is usable, printing why, so a machine without one shows the skip, and runs
// the CPU side of its comparisons on the ops' reference loops (OpDef::cpu_reference).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "kiln/runtime/device.h"
#include "kiln/runtime/tuning.h"
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
  // Suites check the heuristics' kernels against references; the tuning tests switch measuring
  // on themselves (a suite that measured every shape it meets would spend minutes compiling).
  if (!std::getenv("KILN_TUNE")) kiln::rt::set_tune_mode(kiln::rt::TuneMode::cached);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
