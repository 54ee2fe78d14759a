#include "kiln/runtime/kernel_plan.h"

#include <algorithm>
#include <array>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "kiln/error.h"
#include "kiln/runtime/compile_jobs.h"
#include "kiln/runtime/disk_cache.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/log.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/quick_tier.h"
#include "nvrtc_run.h"

namespace kiln::rt {

namespace {

thread_local ShapeOnlyPass* t_pass = nullptr;
thread_local bool t_prefetch_worker = false;
thread_local bool t_late = false;

bool same_request(const KernelRequest& r, const KernelSpec& spec, const DTypes& dtypes, std::uint32_t variant,
                  int device) {
  return r.spec == &spec && r.dtypes == dtypes && r.variant == variant && r.device == device;
}

// The order jobs run in: a run's kernels (quick builds where they compile) first, then the full
// builds that replace quick ones (the ones asked to go first, a step's tile kernels, ahead), then
// alternatives a run may never launch (late requests).
enum class Urgency { run = 0, full_build_first = 1, full_build = 2, late = 3 };
constexpr int kUrgencies = 4;
bool is_full_build(int urgency) {
  return urgency == static_cast<int>(Urgency::full_build_first) || urgency == static_cast<int>(Urgency::full_build);
}

// Worker threads that load requests in order, by urgency. Static, and built after the disk cache
// and the logger it uses, so it is destroyed (its workers joined) before them at exit.
class Prefetcher {
 public:
  Prefetcher() {
    DiskCache::global();
    log();
  }
  // At exit the full builds of quick ones still run, so the next process loads what this one
  // used; loads nothing asked for yet are dropped, and their compiles in flight stopped.
  ~Prefetcher() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      for (Urgency u : {Urgency::run, Urgency::late}) {
        pending_ -= queues_[static_cast<int>(u)].size();
        queues_[static_cast<int>(u)].clear();
      }
    }
    work_.notify_all();
    abandon_background_compiles();
    for (std::thread& t : workers_) t.join();
  }

  void add(std::vector<std::pair<Urgency, std::function<void()>>> jobs, int threads) {
    std::lock_guard lock(mu_);
    for (auto& [urgency, job] : jobs) queues_[static_cast<int>(urgency)].push_back(std::move(job));
    pending_ += jobs.size();
    const std::size_t want = std::min<std::size_t>(static_cast<std::size_t>(threads), queued() + busy_);
    while (workers_.size() < want) workers_.emplace_back([this] {
      t_prefetch_worker = true;
      run();
    });
    log().debug("[plan] {} loads queued for the prefetch threads, {} of them running", jobs.size(), workers_.size());
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
      work_.wait(lock, [this] { return stop_ || queued() > 0; });
      // After stop only full builds are left queued (the others were dropped).
      const auto next = std::find_if(queues_.begin(), queues_.end(), [](const auto& q) { return !q.empty(); });
      if (next == queues_.end()) return;
      auto& queue = *next;
      const bool full_build = is_full_build(static_cast<int>(next - queues_.begin()));
      const std::function<void()> job = std::move(queue.front());
      queue.pop_front();
      ++busy_;
      lock.unlock();
      set_compiles_abandonable(!full_build);
      job();
      lock.lock();
      --busy_;
      --pending_;
      idle_.notify_all();  // a waiter may want this very kernel
    }
  }

  std::mutex mu_;
  std::condition_variable work_, idle_;
  std::size_t queued() const {
    std::size_t n = 0;
    for (const auto& q : queues_) n += q.size();
    return n;
  }

  std::array<std::deque<std::function<void()>>, kUrgencies> queues_;  // by Urgency
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

LateRequests::LateRequests() : ScopedFlag(t_late) {}

bool shape_only() { return t_pass != nullptr; }

// A kernel asked for late and then outside a LateRequests scope is late no more.
void record_request(const KernelSpec& spec, const DTypes& dtypes, std::uint32_t variant, int device) {
  if (!t_pass) return;
  auto& seen = t_pass->requests_;
  const auto known = std::find_if(
      seen.begin(), seen.end(), [&](const KernelRequest& r) { return same_request(r, spec, dtypes, variant, device); });
  if (known == seen.end())
    seen.push_back({&spec, dtypes, variant, device, t_late});
  else
    known->late = known->late && t_late;
}

void prefetch(std::vector<KernelRequest> requests, int threads) {
  const int workers = worker_count(threads);
  // A kernel queued once is not queued again: a worker would only wait there for another's load.
  static std::mutex mu;
  static std::vector<KernelRequest> queued;
  std::vector<std::pair<Urgency, std::function<void()>>> jobs;
  for (const KernelRequest& r : requests) {
    if (!r.spec) throw ValueError("[plan] a prefetch request names no kernel");
    {
      std::lock_guard lock(mu);
      auto same = [&r](const KernelRequest& q) { return same_request(q, *r.spec, r.dtypes, r.variant, r.device); };
      if (std::any_of(queued.begin(), queued.end(), same)) continue;
      queued.push_back(r);
    }
    // Only a run that does not wait for its tuner's alternatives (the quick tier) queues them last.
    jobs.emplace_back(r.late && quick_tier() ? Urgency::late : Urgency::run, [r] {
      try {
        std::optional<FullTierOnly> full;
        if (r.late) full.emplace();
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
  std::vector<std::pair<Urgency, std::function<void()>>> jobs;
  for (SourceRequest& r : sources) {
    jobs.emplace_back(Urgency::run, [r = std::move(r)] {
      try {
        warm_source(r.key, r.source, r.arch);
      } catch (const std::exception& e) {  // the run builds it again when it needs it, and reports it
        log().debug("prefetching {} failed: {}", r.key.label.empty() ? r.key.op : r.key.label, e.what());
      }
    });
  }
  if (!jobs.empty()) prefetcher().add(std::move(jobs), workers);
}

void run_in_background(std::function<void()> job, bool ahead) {
  std::vector<std::pair<Urgency, std::function<void()>>> jobs;
  jobs.emplace_back(ahead ? Urgency::full_build_first : Urgency::full_build, std::move(job));
  prefetcher().add(std::move(jobs), worker_count(0));
}

bool on_prefetch_thread() { return t_prefetch_worker; }

void wait_for_prefetch() { prefetcher().wait(nullptr); }

void wait_for_prefetch_until(const std::function<bool()>& done) { prefetcher().wait(done); }

}  // namespace kiln::rt
