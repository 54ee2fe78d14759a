// kiln_dist_fault: a rank of a data-parallel job that a fault test stops or kills (not part of CI:
// it needs GPUs). Each step is a compiled function whose all_reduce runs inside the replayed CUDA
// graph; after each step the host waits the way SYNC says, so a stopped peer leaves it blocked
// there. Prints "step N" after each step and "ready" once the graph replays.
//   kiln-run -n 2 -- kiln_dist_fault SYNC STEPS [STOP_RANK STOP_AT]
//     SYNC: item | synchronize | event     how the host waits after each step
//     STOP_RANK stops itself with SIGSTOP after STOP_AT steps (a kill -STOP from outside, in-process)
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "kiln/dist.h"
#include "kiln/kiln.h"
#include "kiln/runtime/device.h"

namespace {

int usage() {
  std::fprintf(stderr, "usage: kiln_dist_fault item|synchronize|event STEPS [STOP_RANK STOP_AT]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 5) return usage();
  const std::string sync = argv[1];
  if (sync != "item" && sync != "synchronize" && sync != "event") return usage();
  const int steps = std::atoi(argv[2]);
  const int stop_rank = argc == 5 ? std::atoi(argv[3]) : -1, stop_at = argc == 5 ? std::atoi(argv[4]) : -1;
  try {
    using namespace kiln;
    dist::ProcessGroup pg = dist::ProcessGroup::init();
    const Device dev = pg.device();
    CompiledFunction step = compile([&](const std::vector<Tensor>& in) {
      Tensor y = in[0] * 2.0;
      pg.all_reduce(y, dist::ReduceOp::avg);
      return std::vector<Tensor>{sum(y)};
    });
    const Tensor x = ones({1024, 1024}, {.device = dev});
    rt::Event done = rt::Event::create(dev.index());
    for (int i = 1; i <= steps; ++i) {
      if (pg.rank() == stop_rank && i == stop_at) {
        std::printf("rank %d stops itself before step %d\n", pg.rank(), i);
        std::fflush(stdout);
        raise(SIGSTOP);
      }
      const Tensor out = step({x})[0];
      pg.watch("the compiled step");
      if (sync == "item") {
        (void)out.item<float>();
      } else if (sync == "synchronize") {
        synchronize(dev);
      } else {
        done.record(rt::default_stream(dev.index()));
        done.synchronize();
      }
      if (i == 3) std::printf("ready\n");
      std::printf("step %d\n", i);
      std::fflush(stdout);
    }
    pg.check();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln_dist_fault: %s\n", e.what());
    return 1;
  }
  return 0;
}
