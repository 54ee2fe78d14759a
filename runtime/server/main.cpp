// kiln-nvrtc-server: a compile server the runtime starts, one per compiling thread. NVRTC
// serialises much of its work inside one process; apart, compiles scale with the cores.
// Requests arrive on stdin, outputs leave on stdout (nvrtc_wire.h); it exits at end of input.
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "nvrtc_wire.h"

int main(int argc, char** argv) {
  const bool lowered = argc == 3 && std::strcmp(argv[2], kiln::rt::kNvrtcServerLowered) == 0;
  if ((argc != 2 && !lowered) || std::strcmp(argv[1], kiln::rt::kNvrtcServerProtocol) != 0) {
    std::fprintf(stderr, "kiln-nvrtc-server: started by libkiln_runtime only (it expects %s)\n",
                 kiln::rt::kNvrtcServerProtocol);
    return 2;
  }
  // Below the parent's priority when asked: a run's own threads keep their cores while compiles
  // fill the rest. A failure leaves the priority as it was (setpriority, as glibc marks nice's
  // result as one to use).
  if (lowered) setpriority(PRIO_PROCESS, 0, getpriority(PRIO_PROCESS, 0) + kiln::rt::kNvrtcServerNiceness);
  kiln::rt::serve_nvrtc(STDIN_FILENO, STDOUT_FILENO);
  return 0;
}
