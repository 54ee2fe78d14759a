#include "progress_line.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>

namespace kiln::cli {

bool progress_wanted(bool json) { return !json && ::isatty(STDOUT_FILENO) == 1; }

std::size_t terminal_columns() {
  struct winsize ws {};
  if (::isatty(STDOUT_FILENO) != 1 || ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) != 0) return 0;
  return ws.ws_col;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds)) return "?";
  const long s = std::lround(std::max(0.0, seconds));
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%lds", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, s % 3600 / 60);
  return buf;
}

ProgressLine::ProgressLine(std::ostream& out, bool is_tty, std::size_t total, Options options)
    : out_(out),
      enabled_(is_tty),
      options_(std::move(options)),
      total_(total),
      counts_(options_.counters.size(), 0),
      start_(options_.now()) {}

ProgressLine::~ProgressLine() {
  try {
    finish();
  } catch (...) {  // a stream that throws must not take the process down from a destructor
  }
}

void ProgressLine::tick(std::size_t counter) {
  std::lock_guard lock(mu_);
  ++done_;
  if (counter < counts_.size()) ++counts_[counter];
  redraw_locked();
}

void ProgressLine::update(std::size_t done, std::size_t total) {
  std::lock_guard lock(mu_);
  done_ = done;
  total_ = total;
  redraw_locked();
}

std::function<void(std::size_t, std::size_t)> ProgressLine::as_callback() {
  return [this](std::size_t done, std::size_t total) { update(done, total); };
}

void ProgressLine::finish() {
  std::lock_guard lock(mu_);
  if (finished_) return;
  finished_ = true;
  if (!enabled_ || drawn_ == 0) return;
  out_ << '\r' << std::string(drawn_, ' ') << '\r' << std::flush;
  drawn_ = 0;
}

std::string ProgressLine::text(Clock::time_point now) const {
  std::lock_guard lock(mu_);
  return text_locked(now);
}

std::string ProgressLine::text_locked(Clock::time_point now) const {
  std::string line = options_.what + " " + std::to_string(done_);
  // append, not "/" + std::to_string(): GCC 12 warns falsely (-Wrestrict) on the latter here.
  if (total_ > 0) line.append("/").append(std::to_string(total_));
  line += " " + options_.unit;
  if (total_ > 0) line += " (" + std::to_string(done_ * 100 / total_) + "%)";
  for (std::size_t i = 0; i < counts_.size(); ++i)
    line += (i == 0 ? ": " : ", ") + std::to_string(counts_[i]) + " " + options_.counters[i];
  const double seconds = std::chrono::duration<double>(now - start_).count();
  if (done_ > 0 && seconds > 0) {
    const double rate = static_cast<double>(done_) / seconds;
    char buf[48];
    std::snprintf(buf, sizeof buf, rate < 10 ? "%.1f" : "%.0f", rate);
    line += std::string("; ") + buf + " " + options_.unit + "/s";
    if (total_ >= done_) line += ", " + format_duration(static_cast<double>(total_ - done_) / rate) + " left";
  }
  return line;
}

void ProgressLine::redraw_locked() {
  if (!enabled_ || finished_) return;
  const Clock::time_point now = options_.now();
  if (last_draw_ && now - *last_draw_ < options_.interval) return;
  last_draw_ = now;
  std::string line = text_locked(now);
  if (options_.columns > 1 && line.size() >= options_.columns) line.resize(options_.columns - 1);
  // Spaces cover what a longer previous line left on screen.
  const std::size_t pad = drawn_ > line.size() ? drawn_ - line.size() : 0;
  out_ << '\r' << line << std::string(pad, ' ') << std::flush;
  drawn_ = line.size() + pad;
}

}  // namespace kiln::cli
