#pragma once
// A per-epoch progress bar on a terminal (redrawn in place) or plain lines otherwise.
#include <chrono>
#include <cstdint>
#include <string>

namespace mnist {

class Progress {
 public:
  Progress(int epoch, int epochs, std::int64_t steps);
  // Called after each step; `loss` is the latest loss read back (NaN when none was).
  void update(std::int64_t step, double loss);
  void finish(const std::string& summary);
  // True on the steps where the caller should read the loss back (a synchronisation).
  bool wants_loss(std::int64_t step) const;

 private:
  int epoch_, epochs_;
  std::int64_t steps_;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace mnist
