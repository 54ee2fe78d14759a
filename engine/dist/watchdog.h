#pragma once
// A process group's watchdog: a thread that polls an event recorded after each collective, and
// NCCL's asynchronous error, so that a dead or diverged rank fails the group instead of hanging it.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kiln/runtime/device.h"
#include "nccl_loader.h"

namespace kiln::dist::detail {

class Watchdog {
 public:
  Watchdog(rt::nccl::Comm comm, int device, std::chrono::milliseconds timeout);
  ~Watchdog();  // stops the thread; the communicator stays the owner's
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Watches the work queued on `stream` so far, named `what` in a failure. Not while this thread
  // captures a graph: a captured event is no work to wait for (watch the replay instead).
  void watch(std::string what, const rt::Stream& stream);
  // Waits, up to the timeout, until all watched work finished or the group failed; false if it failed.
  bool drain();
  // Empty while healthy; otherwise what failed, and the communicator has been aborted.
  std::string failure() const;
  bool failed() const { return failed_.load(); }
  // Held while a collective is queued, so the abort never frees the communicator under it.
  // Empty (not owning) when the group has failed.
  std::unique_lock<std::timed_mutex> lock_comm();

 private:
  struct Pending {
    std::string what;
    std::chrono::steady_clock::time_point since;
    rt::Event event;
  };
  void loop();
  void poll_locked();
  void fail_locked(const std::string& why);

  rt::nccl::Comm comm_;
  int device_;
  std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  std::vector<rt::Event> spare_;  // finished events, recorded again by later collectives
  std::string failure_;
  std::atomic<bool> failed_{false};
  std::timed_mutex comm_mu_;  // taken after mu_, never before
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace kiln::dist::detail
