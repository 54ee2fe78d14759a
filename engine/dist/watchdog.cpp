#include "watchdog.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <utility>

#include "driver.h"
#include "kiln/runtime/graph.h"
#include "kiln/runtime/log.h"
#include "rendezvous.h"

namespace kiln::dist::detail {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPoll = std::chrono::milliseconds(20);

std::chrono::milliseconds since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t);
}

void write_stderr(const std::string& text) {
  for (std::size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(STDERR_FILENO, text.data() + done, text.size() - done);
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

// ncclCommAbort on a detached thread: it can block for as long as an NCCL kernel spins, and the
// watchdog must stay free to end the process. The communicator is the group's no more; `done`
// tells the group's destructor when NCCL has let go of it (exiting earlier races its teardown).
void abort_in_background(rt::nccl::Comm comm, int device, std::shared_ptr<AbortDone> done) {
  const rt::nccl::Api* api = rt::nccl::try_api();
  if (!api || !comm) return done->set();
  std::thread([api, comm, device, done] {
    try {
      rt::make_current(device);
    } catch (const std::exception&) {
    }
    const rt::nccl::Result r = api->ncclCommAbort(comm);
    if (r != rt::nccl::kSuccess) rt::log().error("[dist] ncclCommAbort failed (ncclResult_t {})", r);
    done->set();
  }).detach();
}

}  // namespace

void AbortDone::set() {
  std::lock_guard lk(mu);
  done = true;
  cv.notify_all();
}

bool AbortDone::wait_for(std::chrono::milliseconds d) {
  std::unique_lock lk(mu);
  return cv.wait_for(lk, d, [this] { return done; });
}

bool Watchdog::wait_for_abort(std::chrono::milliseconds d) { return abort_done_->wait_for(d); }

void end_process(const std::string& message) {
  write_stderr(message);
  std::_Exit(kFailureExitCode);
}

Watchdog::Watchdog(rt::nccl::Comm comm, WatchdogOptions options)
    : comm_(comm), options_(std::move(options)), thread_([this] { loop(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::watch(std::string what, const rt::Stream& stream) {
  if (rt::thread_capturing()) return;
  std::lock_guard lk(mu_);
  if (!failure_.empty()) return;
  rt::Event e;
  if (!spare_.empty()) {
    e = std::move(spare_.back());
    spare_.pop_back();
  } else {
    e = rt::Event::create(options_.device);
  }
  e.record(stream);
  pending_.push_back({++sequence_, std::move(what), Clock::now(), std::move(e)});
}

bool Watchdog::drain() {
  std::unique_lock lk(mu_);
  const auto deadline = Clock::now() + options_.timeout;
  while (failure_.empty() && !pending_.empty()) {
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout) {
      poll_locked();
      if (failure_.empty() && !pending_.empty())
        fail_locked(describe(pending_.front()) + " had not finished when the group was destroyed, " +
                    seconds_text(since(pending_.front().since)) + " after it was queued; it waits for " + waited_for());
    }
  }
  return failure_.empty();
}

std::unique_lock<std::timed_mutex> Watchdog::lock_comm() {
  std::unique_lock l(comm_mu_);
  if (failed_.load()) l.unlock();
  return l;
}

std::string Watchdog::failure() const {
  std::lock_guard lk(mu_);
  return failure_;
}

std::string Watchdog::describe(const Pending& p) const {
  return "collective #" + std::to_string(p.sequence) + " (" + p.what + ")";
}

// NCCL does not tell which peer is late, and every collective kiln issues spans the whole group.
std::string Watchdog::waited_for() const {
  std::string ranks;
  for (int r = 0; r < options_.env.world_size; ++r) {
    if (r == options_.env.rank) continue;
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  return ranks.empty() ? "no other rank" : "rank" + std::string(options_.env.world_size > 2 ? "s " : " ") + ranks;
}

void Watchdog::loop() {
  try {
    rt::make_current(options_.device);
    // Relaxed: this thread's event queries never invalidate another thread's graph capture.
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    rt::driver().cuThreadExchangeStreamCaptureMode(&mode);
  } catch (const std::exception& e) {
    std::lock_guard lk(mu_);
    fail_locked(std::string("the watchdog could not start: ") + e.what());
  }
  std::unique_lock lk(mu_);
  std::optional<Clock::time_point> end_at;
  while (!stop_) {
    cv_.wait_for(lk, kPoll, [this] { return stop_; });
    if (stop_) break;
    if (failure_.empty()) {
      try {
        poll_locked();
      } catch (const std::exception& e) {
        fail_locked(std::string("the watchdog failed: ") + e.what());
      }
      cv_.notify_all();  // drain() waits for pending_ to empty
    }
    if (failure_.empty() || options_.on_failure != OnFailure::end_process) continue;
    // The process had its grace to end on its own (a caught DeviceError, a checkpoint kept): a
    // thread still blocked in a device synchronisation behind a spinning kernel never returns.
    if (!end_at) end_at = Clock::now() + options_.exit_grace;
    if (Clock::now() >= *end_at)
      end_process("kiln.dist: rank " + std::to_string(options_.env.rank) + ": ending the process (exit code " +
                  std::to_string(kFailureExitCode) + ") " + seconds_text(options_.exit_grace) +
                  " after the process group failed; the last checkpoint on disk is what survives\n");
  }
}

void Watchdog::poll_locked() {
  if (!failure_.empty()) return;
  const rt::nccl::Api& api = rt::nccl::api();
  rt::nccl::Result async = rt::nccl::kSuccess;
  const rt::nccl::Result r = api.ncclCommGetAsyncError(comm_, &async);
  if (r != rt::nccl::kSuccess) async = r;
  if (async != rt::nccl::kSuccess && async != rt::nccl::kInProgress) {
    const char* text = api.ncclGetErrorString(async);
    std::string what = "NCCL reported an error (" + std::string(text ? text : "unknown") + ")";
    if (!pending_.empty())
      what += " during " + describe(pending_.front()) + ", " + seconds_text(since(pending_.front().since)) +
              " after it was queued; it waits for " + waited_for();
    fail_locked(what);
    return;
  }
  while (!pending_.empty()) {
    Pending& p = pending_.front();
    bool done = false;
    try {
      done = p.event.done();
    } catch (const std::exception& e) {
      fail_locked(describe(p) + " failed on the GPU: " + e.what());
      return;
    }
    if (!done) {
      if (since(p.since) > options_.timeout)
        fail_locked(describe(p) + " did not complete within the timeout of " + seconds_text(options_.timeout) +
                    " (KILN_DIST_TIMEOUT_S): waited " + seconds_text(since(p.since)) + " for " + waited_for() +
                    ", which may have died or stopped");
      return;
    }
    spare_.push_back(std::move(p.event));
    pending_.pop_front();
  }
}

void Watchdog::fail_locked(const std::string& why) {
  failure_ = why;
  failed_.store(true);
  // Printed first: the abort below, or the device, may block this process for good.
  write_stderr("kiln.dist: error: rank " + std::to_string(options_.env.rank) + " of " +
               std::to_string(options_.env.world_size) + ": " + why + "; aborting the NCCL communicator\n");
  // A collective stuck in its launch (the GPU's queue full behind a hung kernel) keeps the lock:
  // go on after a while anyway. Once failed_ is set no new NCCL call starts.
  std::unique_lock comm_lock(comm_mu_, std::defer_lock);
  (void)comm_lock.try_lock_for(std::chrono::seconds(1));
  if (comm_lock.owns_lock()) comm_lock.unlock();
  abort_in_background(comm_, options_.device, abort_done_);
  pending_.clear();
  cv_.notify_all();
}

}  // namespace kiln::dist::detail
