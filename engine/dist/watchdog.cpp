#include "watchdog.h"

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

}  // namespace

Watchdog::Watchdog(rt::nccl::Comm comm, int device, std::chrono::milliseconds timeout)
    : comm_(comm), device_(device), timeout_(timeout), thread_([this] { loop(); }) {}

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
    e = rt::Event::create(device_);
  }
  e.record(stream);
  pending_.push_back({std::move(what), Clock::now(), std::move(e)});
}

bool Watchdog::drain() {
  std::unique_lock lk(mu_);
  const auto deadline = Clock::now() + timeout_;
  while (failure_.empty() && !pending_.empty()) {
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout) {
      poll_locked();
      if (failure_.empty() && !pending_.empty())
        fail_locked(pending_.front().what + " had not finished when the group was destroyed, " +
                    seconds_text(since(pending_.front().since)) + " after it was queued");
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

void Watchdog::loop() {
  try {
    rt::make_current(device_);
    // Relaxed: this thread's event queries never invalidate another thread's graph capture.
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    rt::driver().cuThreadExchangeStreamCaptureMode(&mode);
  } catch (const std::exception& e) {
    std::lock_guard lk(mu_);
    fail_locked(std::string("the watchdog could not start: ") + e.what());
  }
  std::unique_lock lk(mu_);
  while (!stop_) {
    cv_.wait_for(lk, kPoll, [this] { return stop_; });
    if (stop_ || !failure_.empty()) continue;
    try {
      poll_locked();
    } catch (const std::exception& e) {
      fail_locked(std::string("the watchdog failed: ") + e.what());
    }
    cv_.notify_all();  // drain() waits for pending_ to empty
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
      what += " during " + pending_.front().what + ", " + seconds_text(since(pending_.front().since)) +
              " after it was queued";
    fail_locked(what);
    return;
  }
  while (!pending_.empty()) {
    Pending& p = pending_.front();
    bool done = false;
    try {
      done = p.event.done();
    } catch (const std::exception& e) {
      fail_locked(p.what + " failed on the GPU: " + e.what());
      return;
    }
    if (!done) {
      if (since(p.since) > timeout_)
        fail_locked(p.what + " did not finish within the timeout: waited " + seconds_text(since(p.since)));
      return;
    }
    spare_.push_back(std::move(p.event));
    pending_.pop_front();
  }
}

void Watchdog::fail_locked(const std::string& why) {
  failure_ = why;
  failed_.store(true);
  // A collective stuck in its launch (the GPU's queue full behind a hung kernel) keeps the lock:
  // abort anyway after a while, since the abort is what unblocks it.
  std::unique_lock comm_lock(comm_mu_, std::defer_lock);
  (void)comm_lock.try_lock_for(std::chrono::seconds(2));
  // Aborting stops NCCL's kernels, so the stream (and the next collective) does not wait forever.
  const rt::nccl::Api* api = rt::nccl::try_api();
  if (api && comm_) {
    const rt::nccl::Result r = api->ncclCommAbort(comm_);
    if (r != rt::nccl::kSuccess) rt::log().error("[dist] ncclCommAbort failed (ncclResult_t {})", r);
  }
  rt::log().error("[dist] process group failed: {}", why);
  pending_.clear();
  cv_.notify_all();
}

}  // namespace kiln::dist::detail
