#include "kiln/runtime/kernel_plan.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "kiln/error.h"
#include "kiln/runtime/compile_jobs.h"
#include "kiln/runtime/disk_cache.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/log.h"
#include "kiln/runtime/module_cache.h"

namespace kiln::rt {

namespace {

thread_local ShapeOnlyPass* t_pass = nullptr;
thread_local bool t_prefetch_worker = false;
thread_local bool t_late = false;

bool same_request(const KernelRequest& r, const KernelSpec& spec, const DTypes& dtypes, std::uint32_t variant,
                  int device) {
  return r.spec == &spec && r.dtypes == dtypes && r.variant == variant && r.device == device;
}

// Worker threads that load requests in order. Static, and built after the disk cache and the
// logger it uses, so it is destroyed (its workers joined) before them at exit.
class Prefetcher {
 public:
  Prefetcher() {
    DiskCache::global();
    log();
  }
  ~Prefetcher() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      pending_ -= queue_.size();
      queue_.clear();
    }
    work_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  void add(std::vector<std::function<void()>> jobs, int threads) {
    std::lock_guard lock(mu_);
    for (auto& j : jobs) queue_.push_back(std::move(j));
    pending_ += jobs.size();
    const std::size_t want = std::min<std::size_t>(static_cast<std::size_t>(threads), queue_.size() + busy_);
    while (workers_.size() < want) workers_.emplace_back([this] {
      t_prefetch_worker = true;
      run();
    });
    work_.notify_all();
  }

  void wait(const std::function<bool()>& done) {
    std::unique_lock lock(mu_);
    idle_.wait(lock, [&] { return pending_ == 0 || (done && done()); });
  }

 private:
  void run() {
    for (;;) {
      std::unique_lock lock(mu_);
      work_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      const std::function<void()> job = std::move(queue_.front());
      queue_.pop_front();
      ++busy_;
      lock.unlock();
      job();
      lock.lock();
      --busy_;
      --pending_;
      idle_.notify_all();  // a waiter may want this very kernel
    }
  }

  std::mutex mu_;
  std::condition_variable work_, idle_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> workers_;
  std::size_t pending_ = 0, busy_ = 0;
  bool stop_ = false;
};

Prefetcher& prefetcher() {
  static Prefetcher p;
  return p;
}

int worker_count(int threads) {
  if (threads < 0) throw ValueError("[plan] prefetch threads must be >= 0, got " + std::to_string(threads));
  return threads > 0 ? threads : background_compile_jobs();
}

}  // namespace

ShapeOnlyPass::ShapeOnlyPass() {
  if (t_pass) throw ValueError("[plan] shape-only passes do not nest");
  t_pass = this;
}

ShapeOnlyPass::~ShapeOnlyPass() { t_pass = nullptr; }

std::vector<KernelRequest> ShapeOnlyPass::requests() const {
  std::vector<KernelRequest> all = requests_;
  all.insert(all.end(), late_.begin(), late_.end());
  return all;
}

LateRequests::LateRequests() : was_(t_late) { t_late = true; }

LateRequests::~LateRequests() { t_late = was_; }

bool shape_only() { return t_pass != nullptr; }

// A kernel asked for late and then outside a LateRequests scope moves up to the others.
void record_request(const KernelSpec& spec, const DTypes& dtypes, std::uint32_t variant, int device) {
  if (!t_pass) return;
  auto same = [&](const KernelRequest& r) { return same_request(r, spec, dtypes, variant, device); };
  auto& now = t_pass->requests_;
  auto& late = t_pass->late_;
  if (std::any_of(now.begin(), now.end(), same)) return;
  const auto was_late = std::find_if(late.begin(), late.end(), same);
  if (t_late) {
    if (was_late == late.end()) late.push_back({&spec, dtypes, variant, device});
    return;
  }
  if (was_late != late.end()) late.erase(was_late);
  now.push_back({&spec, dtypes, variant, device});
}

void prefetch(std::vector<KernelRequest> requests, int threads) {
  const int workers = worker_count(threads);
  // A kernel queued once is not queued again: a worker would only wait there for another's load.
  static std::mutex mu;
  static std::vector<KernelRequest> queued;
  std::vector<std::function<void()>> jobs;
  for (const KernelRequest& r : requests) {
    if (!r.spec) throw ValueError("[plan] a prefetch request names no kernel");
    {
      std::lock_guard lock(mu);
      auto same = [&r](const KernelRequest& q) { return same_request(q, *r.spec, r.dtypes, r.variant, r.device); };
      if (std::any_of(queued.begin(), queued.end(), same)) continue;
      queued.push_back(r);
    }
    jobs.emplace_back([r] {
      try {
        get_function(*r.spec, r.dtypes, r.variant, r.device);
      } catch (const std::exception& e) {  // the run's own call tries again and reports it
        log().debug("prefetching {} ({}) failed: {}", r.spec->op, r.dtypes.str(), e.what());
      }
    });
  }
  if (!jobs.empty()) prefetcher().add(std::move(jobs), workers);
}

void prefetch_sources(std::vector<SourceRequest> sources, int threads) {
  const int workers = worker_count(threads);
  std::vector<std::function<void()>> jobs;
  for (SourceRequest& r : sources) {
    jobs.emplace_back([r = std::move(r)] {
      try {
        warm_source(r.key, r.source, r.arch);
      } catch (const std::exception& e) {  // the run builds it again when it needs it, and reports it
        log().debug("prefetching {} failed: {}", r.key.label.empty() ? r.key.op : r.key.label, e.what());
      }
    });
  }
  if (!jobs.empty()) prefetcher().add(std::move(jobs), workers);
}

bool on_prefetch_thread() { return t_prefetch_worker; }

void wait_for_prefetch() { prefetcher().wait(nullptr); }

void wait_for_prefetch_until(const std::function<bool()>& done) { prefetcher().wait(done); }

}  // namespace kiln::rt
