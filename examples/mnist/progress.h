#pragma once
// A per-epoch progress bar on a terminal (redrawn in place) or plain lines otherwise.
//
// Samples/s and the time left come from host wall-clock read in update(), which the trainer
// calls only right after reading a loss back (wants_loss): the device has then finished every
// step counted, so the numbers are true and no synchronisation is added for them. Timing step
// submissions instead would measure how fast the host queues work, far ahead of a compiled
// step's replays, and syncing per step would slow the run the bar reports on.
#include <chrono>
#include <cstdint>
#include <string>

namespace mnist {

// Throughput from (seconds since the epoch began, samples done) readings. After the first
// reading it counts only from there, so the first step's kernel compiles and graph capture
// do not drag the rate and the time left for the whole epoch.
class RateMeter {
 public:
  void record(double seconds, std::int64_t samples);
  double samples_per_s() const;                           // NaN before any reading with time elapsed
  double seconds_left(std::int64_t total_samples) const;  // NaN when the rate is unknown

 private:
  double first_s_ = -1, last_s_ = 0;
  std::int64_t first_samples_ = 0, last_samples_ = 0;
};

struct ProgressView {
  int epoch = 0, epochs = 0;
  std::int64_t step = 0, steps = 0;
  double loss = 0, samples_per_s = 0, seconds_left = 0;
};

// "epoch 3/10 [====            ] 120/469 loss 0.2345, 52.3k samples/s, ETA 3s"
std::string progress_line(const ProgressView& v);
// "950", "52.3k", "1.25M"; "?" when not finite.
std::string format_rate(double per_s);

// What a run that will take long prints once, from its rate after the first steps: "mnist-train:
// on the CPU this run will take about 38m (26 samples/s); a GPU takes seconds". Empty when the
// `samples_left` take less than `threshold_s` at `samples_per_s`, or the rate is unknown.
std::string long_run_note(double samples_per_s, std::int64_t samples_left, double threshold_s = 120);

class Progress {
 public:
  Progress(int epoch, int epochs, std::int64_t steps, std::int64_t samples);
  // Called after the steps up to `step` (`samples` of this epoch) with the latest loss read back.
  void update(std::int64_t step, std::int64_t samples, double loss);
  void finish(const std::string& summary);
  // A line of its own above the bar, which the next update redraws.
  void note(const std::string& line);
  // True on the steps where the caller should read the loss back (a synchronisation).
  bool wants_loss(std::int64_t step) const;

 private:
  int epoch_, epochs_;
  std::int64_t steps_, samples_;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
  RateMeter rate_;
};

}  // namespace mnist
