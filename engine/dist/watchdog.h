#pragma once
// A process group's watchdog: a thread that polls an event recorded after each collective, and
// NCCL's asynchronous error, so that a dead or stopped rank fails the group instead of hanging it.
// On a failure it prints the error at once, aborts the communicator on a thread of its own (an
// abort can block behind a spinning NCCL kernel), and, unless told to only throw, ends the process
// after a short grace: a host thread blocked in a device synchronisation cannot be woken otherwise.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kiln/dist.h"
#include "kiln/runtime/device.h"
#include "nccl_loader.h"

namespace kiln::dist::detail {

struct WatchdogOptions {
  Env env;  // whose collectives: for messages and the ranks waited for
  int device = 0;
  std::chrono::milliseconds timeout{};
  OnFailure on_failure = OnFailure::end_process;
  std::chrono::milliseconds exit_grace{};  // from the failure to the end of the process
};

// Set once ncclCommAbort returned.
struct AbortDone {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  void set();
  bool wait_for(std::chrono::milliseconds d);  // false when still aborting after d
};

class Watchdog {
 public:
  Watchdog(rt::nccl::Comm comm, WatchdogOptions options);
  ~Watchdog();  // stops the thread; the communicator stays the owner's
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Watches the work queued on `stream` so far as the group's next collective (numbered from 1),
  // named `what` in a failure. Not while this thread captures a graph: a captured event is no work
  // to wait for (watch the replay instead).
  void watch(std::string what, const rt::Stream& stream);
  // Waits, up to the timeout, until all watched work finished or the group failed; false if it failed.
  bool drain();
  // Empty while healthy; otherwise what failed, and the communicator is being aborted.
  std::string failure() const;
  bool failed() const { return failed_.load(); }
  // After a failure: waits up to `d` for the communicator's abort to return; false if it has not.
  bool wait_for_abort(std::chrono::milliseconds d);
  const WatchdogOptions& options() const { return options_; }
  // Held while a collective is queued, so the abort never frees the communicator under it.
  // Empty (not owning) when the group has failed.
  std::unique_lock<std::timed_mutex> lock_comm();

 private:
  struct Pending {
    std::uint64_t sequence = 0;
    std::string what;
    std::chrono::steady_clock::time_point since;
    rt::Event event;
  };
  void loop();
  void poll_locked();
  void fail_locked(const std::string& why);
  std::string describe(const Pending& p) const;
  std::string waited_for() const;

  rt::nccl::Comm comm_;
  WatchdogOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  std::vector<rt::Event> spare_;  // finished events, recorded again by later collectives
  std::uint64_t sequence_ = 0;    // collectives watched so far
  std::string failure_;
  std::atomic<bool> failed_{false};
  std::timed_mutex comm_mu_;  // taken after mu_, never before
  std::shared_ptr<AbortDone> abort_done_ = std::make_shared<AbortDone>();
  bool stop_ = false;
  std::thread thread_;
};

// Prints `message` to stderr in one write and ends the process with kFailureExitCode, without
// running destructors or atexit handlers (they could block on the stuck device).
[[noreturn]] void end_process(const std::string& message);

}  // namespace kiln::dist::detail
