#pragma once
// Shared by tests that read what kiln logs: a capture of the kiln logger's messages.
// First of spdlog and fmt: kiln/runtime/log.h includes them past GCC 13's false positive in fmt.
#include <spdlog/sinks/ringbuffer_sink.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "kiln/runtime/log.h"

namespace kiln_test {

// Collects what the kiln logger emits at `from` (warn unless given) and above while alive.
class LogCapture {
 public:
  // Replaces the logger's sinks, so expected messages stay out of the test output.
  explicit LogCapture(spdlog::level::level_enum from = spdlog::level::warn, std::size_t lines = 256)
      : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(lines)) {
    auto& log = kiln::rt::log();
    level_ = log.level();
    if (level_ > from) log.set_level(from);
    saved_.swap(log.sinks());
    log.sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& log = kiln::rt::log();
    log.sinks().swap(saved_);
    log.set_level(level_);
  }
  std::vector<std::string> lines() const { return sink_->last_formatted(); }
  int count(const std::string& needle) const {
    auto all = lines();
    return static_cast<int>(
        std::count_if(all.begin(), all.end(), [&](const std::string& l) { return l.find(needle) != l.npos; }));
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
  std::vector<spdlog::sink_ptr> saved_;
  spdlog::level::level_enum level_;
};

}  // namespace kiln_test
