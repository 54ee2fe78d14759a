// doctest main shared by every suite. The GPU suite exits 77 (ctest: skipped)
// when no GPU is usable, printing why, so a machine without one shows the skip.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "kiln/runtime/device.h"

int main(int argc, char** argv) {
#ifdef KILN_GPU_SUITE
  std::string why;
  if (!kiln::rt::gpu_available(&why)) {
    std::printf("SKIPPED: GPU tests need a GPU: %s\n", why.c_str());
    return 77;
  }
#endif
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
