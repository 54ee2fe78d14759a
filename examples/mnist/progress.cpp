#include "progress.h"

#include "progress_line.h"  // kiln_cli: format_duration

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace mnist {

namespace {
constexpr int kBarWidth = 16;
constexpr std::int64_t kRedraws = 50;  // per epoch: each reads the loss back once
constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();
}  // namespace

void RateMeter::record(double seconds, std::int64_t samples) {
  if (first_s_ < 0) first_s_ = seconds, first_samples_ = samples;
  last_s_ = seconds;
  last_samples_ = samples;
}

double RateMeter::samples_per_s() const {
  if (first_s_ < 0) return kUnknown;
  if (last_s_ > first_s_) return static_cast<double>(last_samples_ - first_samples_) / (last_s_ - first_s_);
  return last_s_ > 0 ? static_cast<double>(last_samples_) / last_s_ : kUnknown;  // one reading: since the start
}

double RateMeter::seconds_left(std::int64_t total_samples) const {
  const double rate = samples_per_s();
  if (!(rate > 0)) return kUnknown;
  return static_cast<double>(std::max<std::int64_t>(0, total_samples - last_samples_)) / rate;
}

std::string format_rate(double per_s) {
  if (!std::isfinite(per_s)) return "?";
  char buf[32];
  if (per_s < 1e4)
    std::snprintf(buf, sizeof buf, "%.0f", per_s);
  else if (per_s < 1e6)
    std::snprintf(buf, sizeof buf, "%.1fk", per_s / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.2fM", per_s / 1e6);
  return buf;
}

std::string progress_line(const ProgressView& v) {
  const auto filled = static_cast<int>(kBarWidth * v.step / std::max<std::int64_t>(v.steps, 1));
  char buf[200];
  std::snprintf(buf, sizeof buf, "epoch %d/%d [%.*s%*s] %lld/%lld loss %.4f, %s samples/s, ETA %s", v.epoch, v.epochs,
                filled, "================", kBarWidth - filled, "", static_cast<long long>(v.step),
                static_cast<long long>(v.steps), v.loss, format_rate(v.samples_per_s).c_str(),
                kiln::cli::format_duration(v.seconds_left).c_str());
  return buf;
}

Progress::Progress(int epoch, int epochs, std::int64_t steps, std::int64_t samples)
    : epoch_(epoch),
      epochs_(epochs),
      steps_(steps),
      samples_(samples),
      tty_(isatty(STDOUT_FILENO) != 0),
      start_(std::chrono::steady_clock::now()) {}

bool Progress::wants_loss(std::int64_t step) const {
  if (!tty_) return false;
  const std::int64_t every = std::max<std::int64_t>(1, steps_ / kRedraws);
  return step % every == 0 || step == steps_;
}

void Progress::update(std::int64_t step, std::int64_t samples, double loss) {
  if (!tty_ || std::isnan(loss)) return;
  rate_.record(std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(), samples);
  const ProgressView v{epoch_, epochs_, step, steps_, loss, rate_.samples_per_s(), rate_.seconds_left(samples_)};
  std::printf("\r%s\033[K", progress_line(v).c_str());  // \033[K: no tail left from a longer line
  std::fflush(stdout);
}

std::string long_run_note(double samples_per_s, std::int64_t samples_left, double threshold_s) {
  if (!(samples_per_s > 0)) return "";
  const double seconds = static_cast<double>(samples_left) / samples_per_s;
  if (!(seconds >= threshold_s)) return "";
  return "mnist-train: on the CPU this run will take about " + kiln::cli::format_duration(seconds) + " (" +
         format_rate(samples_per_s) + " samples/s); a GPU takes seconds";
}

void Progress::note(const std::string& line) {
  if (tty_) std::printf("\r\033[K");
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

void Progress::finish(const std::string& summary) {
  if (tty_) std::printf("\r\033[K");
  std::printf("epoch %d/%d %s\n", epoch_, epochs_, summary.c_str());
  std::fflush(stdout);
}

}  // namespace mnist
