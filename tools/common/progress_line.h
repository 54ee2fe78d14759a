#pragma once
// One status line that redraws itself with '\r' while a long command runs (jitcc warm,
// verify, gc, list). Drawn only on a terminal: piped or --json output stays byte-identical.
#include <chrono>
#include <cstddef>
#include <functional>
#include <iosfwd>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace kiln::cli {

// True when stdout is a terminal and the command was not asked for JSON.
bool progress_wanted(bool json);
// The terminal's width in columns, 0 when stdout is not a terminal or does not say.
std::size_t terminal_columns();

class ProgressLine {
 public:
  using Clock = std::chrono::steady_clock;

  struct Options {
    std::string what;                   // leads the line: "warm", "verify"
    std::string unit = "entries";       // what is counted: "kernels"
    std::vector<std::string> counters;  // how items ended: {"compiled", "cached", "failed"}
    std::size_t columns = 0;            // truncate to fit (no wrap, which '\r' cannot undo); 0: no limit
    Clock::duration interval = std::chrono::milliseconds(100);  // at most 10 redraws a second
    std::function<Clock::time_point()> now = Clock::now;        // tests pass a fake clock
  };

  // Writes nothing at all unless `is_tty`. `total` may be 0 until update() learns it.
  ProgressLine(std::ostream& out, bool is_tty, std::size_t total, Options options);
  ~ProgressLine();  // finish()
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // One item done, counted under counters[counter]. Thread-safe.
  void tick(std::size_t counter = 0);
  // `done` of `total` items, for a loop that reports its own position. Thread-safe.
  void update(std::size_t done, std::size_t total);
  // update() as a callback, e.g. for DiskCache::list; valid while this object lives.
  std::function<void(std::size_t done, std::size_t total)> as_callback();
  // Erases the line, so the summary printed next starts at column 0. Idempotent.
  void finish();

  // The line for the current counts at `now`: "warm 12/850 kernels (1%): 10 compiled, 2 cached,
  // 0 failed; 7.5 kernels/s, 1m52s left".
  std::string text(Clock::time_point now) const;

 private:
  std::string text_locked(Clock::time_point now) const;
  void redraw_locked();

  std::ostream& out_;
  const bool enabled_;
  Options options_;
  mutable std::mutex mu_;
  std::size_t total_, done_ = 0;
  std::vector<std::size_t> counts_;
  Clock::time_point start_;
  std::optional<Clock::time_point> last_draw_;  // the first update draws at once
  std::size_t drawn_ = 0;                       // characters of the line now on screen
  bool finished_ = false;
};

// "42s", "3m07s", "2h05m"; "?" when not finite (shared with mnist-train's progress bar).
std::string format_duration(double seconds);

}  // namespace kiln::cli
