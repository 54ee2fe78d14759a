#include "parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
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

// Spins up to ~50 us for done() before the caller falls back to sleeping: the steps of a CPU
// op follow each other within microseconds, and a thread that sleeps between them waits for
// the scheduler to give its core back, which on a busy machine is milliseconds.
template <class F>
bool spin_until(F&& done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
  // The clock is read every 32 polls: reading it on each took a few percent of a CPU step.
  for (unsigned polls = 1; !done(); ++polls) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    if (polls % 32 == 0 && std::chrono::steady_clock::now() > until) return false;
  }
  return true;
}

// Workers spin briefly, then sleep on a condition variable between jobs; a job is split into
// chunks that the workers and the caller take from its atomic counter. A worker that wakes
// late holds the finished job, whose counter is spent, so it never runs a chunk twice.
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
    job->chunks = chunks;
    job->pending.store(chunks);
    {
      std::lock_guard lock(mu_);
      job_ = job;
      generation_.fetch_add(1);
    }
    wake_.notify_all();
    take_chunks(*job);
    auto finished = [&] { return job->pending.load() == 0; };
    if (!spin_until(finished)) {
      std::unique_lock lock(mu_);
      done_.wait(lock, finished);
    }
    {
      std::lock_guard lock(mu_);
      job_.reset();
    }
    if (job->error) std::rethrow_exception(job->error);
    return true;
  }

 private:
  struct Job {
    const std::function<void(std::int64_t)>* chunk = nullptr;
    std::int64_t chunks = 0;
    std::atomic<std::int64_t> next{0}, pending{0};
    std::exception_ptr error;  // written under mu_, read once pending is 0
  };

  void take_chunks(Job& job) {
    t_in_job = true;
    for (std::int64_t i = job.next.fetch_add(1); i < job.chunks; i = job.next.fetch_add(1)) {
      try {
        (*job.chunk)(i);
      } catch (...) {
        std::lock_guard lock(mu_);
        if (!job.error) job.error = std::current_exception();
      }
      if (job.pending.fetch_sub(1) == 1) {
        std::lock_guard lock(mu_);  // the caller checks `pending` under mu_ before it sleeps
        done_.notify_all();
      }
    }
    t_in_job = false;
  }

  void work() {
    std::uint64_t seen = 0;
    while (true) {
      std::shared_ptr<Job> job;
      spin_until([&] { return generation_.load() != seen; });
      {
        std::unique_lock lock(mu_);
        wake_.wait(lock, [&] { return generation_.load() != seen; });
        seen = generation_.load();
        job = job_;
      }
      if (job) take_chunks(*job);
    }
  }

  std::vector<std::thread> threads_;
  std::mutex submit_, mu_;
  std::condition_variable wake_, done_;
  std::shared_ptr<Job> job_;                  // guarded by mu_
  std::atomic<std::uint64_t> generation_{0};  // changed under mu_
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
  // A few chunks per thread, so that a thread the scheduler runs late leaves its share to the others.
  const std::int64_t chunks = std::min<std::int64_t>((n + grain - 1) / grain, 4 * num_threads());
  if (chunks <= 1 || t_in_job || !pool()) return f(0, n);
  const std::int64_t per = (n + chunks - 1) / chunks;
  const std::function<void(std::int64_t)> chunk = [&](std::int64_t i) {
    const std::int64_t b = i * per, e = std::min(n, b + per);
    if (b < e) f(b, e);
  };
  if (!pool()->run(chunks, chunk)) f(0, n);
}

}  // namespace kiln::cpu
