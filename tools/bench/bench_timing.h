#pragma once
// GPU timing shared by the benchmarks in tools/bench (bench_ops, bench_conv).
#include <algorithm>
#include <functional>
#include <vector>

#include "kiln/runtime/device.h"

namespace kiln::bench {

// Median milliseconds of `body` over `reps` runs, each between two events on `stream`, after
// `warmup` untimed runs (these take the NVRTC compiles and first allocations out of the figure).
inline double median_event_ms(const rt::Stream& stream, const std::function<void()>& body, int reps, int warmup = 2) {
  for (int i = 0; i < warmup; ++i) body();
  stream.synchronize();
  rt::Event start = rt::Event::create(stream.device(), true), stop = rt::Event::create(stream.device(), true);
  std::vector<double> ms;
  for (int i = 0; i < std::max(1, reps); ++i) {
    start.record(stream);
    body();
    stop.record(stream);
    stop.synchronize();
    ms.push_back(stop.elapsed_ms_since(start));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace kiln::bench
