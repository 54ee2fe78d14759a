#include "parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kiln::cpu {

namespace {

thread_local bool t_in_job = false;

// Workers sleep on a condition variable between jobs; a job is split into chunks that the
// workers and the caller take from its atomic counter. A worker that wakes late holds the
// finished job, whose counter is spent, so it never runs a chunk twice.
class Pool {
 public:
  explicit Pool(int workers) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
  }
  // Never destroyed (see pool()): workers blocked at exit end with the process.

  // False, having run nothing, when another job holds the pool.
  bool run(std::int64_t chunks, const std::function<void(std::int64_t)>& chunk) {
    std::unique_lock busy(submit_, std::try_to_lock);
    if (!busy) return false;
    auto job = std::make_shared<Job>();
    job->chunk = &chunk;
    job->chunks = job->pending = chunks;
    {
      std::lock_guard lock(mu_);
      job_ = job;
      ++generation_;
    }
    wake_.notify_all();
    take_chunks(*job);
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return job->pending == 0; });
    job_.reset();
    if (job->error) std::rethrow_exception(job->error);
    return true;
  }

 private:
  struct Job {
    const std::function<void(std::int64_t)>* chunk = nullptr;
    std::int64_t chunks = 0, pending = 0;  // pending: guarded by mu_
    std::atomic<std::int64_t> next{0};
    std::exception_ptr error;  // guarded by mu_
  };

  void take_chunks(Job& job) {
    t_in_job = true;
    for (std::int64_t i = job.next.fetch_add(1); i < job.chunks; i = job.next.fetch_add(1)) {
      std::exception_ptr error;
      try {
        (*job.chunk)(i);
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard lock(mu_);
      if (error && !job.error) job.error = error;
      if (--job.pending == 0) done_.notify_all();
    }
    t_in_job = false;
  }

  void work() {
    std::uint64_t seen = 0;
    while (true) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock lock(mu_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        job = job_;
      }
      if (job) take_chunks(*job);
    }
  }

  std::vector<std::thread> threads_;
  std::mutex submit_, mu_;
  std::condition_variable wake_, done_;
  std::shared_ptr<Job> job_;  // guarded by mu_
  std::uint64_t generation_ = 0;
};

Pool* pool() {
  static Pool* p = num_threads() > 1 ? new Pool(num_threads() - 1) : nullptr;
  return p;
}

}  // namespace

int num_threads() {
  static const int n = [] {
    if (const char* env = std::getenv("KILN_CPU_THREADS"); env && *env) {
      const int v = std::atoi(env);
      if (v >= 1) return std::min(v, 256);
    }
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }();
  return n;
}

void parallel_for(std::int64_t n, std::int64_t grain, const std::function<void(std::int64_t, std::int64_t)>& f) {
  if (n <= 0) return;
  grain = std::max<std::int64_t>(grain, 1);
  const std::int64_t chunks = std::min<std::int64_t>((n + grain - 1) / grain, num_threads());
  if (chunks <= 1 || t_in_job || !pool()) return f(0, n);
  const std::int64_t per = (n + chunks - 1) / chunks;
  const std::function<void(std::int64_t)> chunk = [&](std::int64_t i) {
    const std::int64_t b = i * per, e = std::min(n, b + per);
    if (b < e) f(b, e);
  };
  if (!pool()->run(chunks, chunk)) f(0, n);
}

}  // namespace kiln::cpu
