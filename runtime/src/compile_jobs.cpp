#include "kiln/runtime/compile_jobs.h"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include "kiln/error.h"

namespace kiln::rt {

namespace {

constexpr int kMostJobs = 4096;

const char* compile_jobs_env() {
  const char* v = std::getenv("KILN_COMPILE_JOBS");
  return v && *v ? v : nullptr;
}

// `s` as a whole number (digits only, nothing after them), or nullopt.
std::optional<int> whole_number(const char* s) {
  int n = 0;
  const char* end = s + std::strlen(s);
  const auto [p, ec] = std::from_chars(s, end, n);
  return ec == std::errc{} && p == end ? std::optional<int>(n) : std::nullopt;
}

}  // namespace

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int ranks_on_node() {
  const char* v = std::getenv("LOCAL_WORLD_SIZE");
  const std::optional<int> n = v ? whole_number(v) : std::nullopt;
  return n && *n >= 1 ? *n : 1;
}

int compile_jobs_for(const char* env, int cpus, int ranks) {
  if (env) {
    const std::optional<int> jobs = whole_number(env);
    if (!jobs || *jobs < 1 || *jobs > kMostJobs)
      throw ValueError("[compile] KILN_COMPILE_JOBS must be a whole number from 1 to " + std::to_string(kMostJobs) +
                       ", got '" + std::string(env) + "'");
    return *jobs;
  }
  return std::max(1, std::clamp(cpus, 1, kCompileJobsCap) / std::max(1, ranks));
}

int compile_jobs() { return compile_jobs_for(compile_jobs_env(), usable_cpus(), ranks_on_node()); }

int background_compile_jobs() {
  if (const char* env = compile_jobs_env()) return compile_jobs_for(env, 1);
  const int ranks = ranks_on_node();
  return compile_jobs_for(nullptr, usable_cpus() - ranks, ranks);
}

int prefetch_jobs_for(const char* env, int background, std::size_t kernels) {
  if (env) return compile_jobs_for(env, 1);
  const std::size_t by_work = (kernels + kKernelsPerServer - 1) / kKernelsPerServer;
  return std::max(1,
                  static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(std::max(1, background)), by_work)));
}

int prefetch_jobs(std::size_t kernels) {
  const char* env = compile_jobs_env();
  return prefetch_jobs_for(env, env ? 1 : background_compile_jobs(), kernels);
}

}  // namespace kiln::rt
