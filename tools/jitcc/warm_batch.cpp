#include "warm_batch.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "kiln/error.h"
#include "kiln/runtime/compile_jobs.h"
#include "kiln/runtime/kernel_registry.h"

namespace jitcc {

namespace rt = kiln::rt;

namespace {

void parallel_for(std::size_t n, int threads, const std::function<void(std::size_t)>& body) {
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    for (std::size_t i = next++; i < n; i = next++) body(i);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
}

// Why fewer kernels are in the cache than were built; the disk cache has already logged the cause.
std::string unstored_reason(const rt::DiskCache& cache) {
  if (cache.mode() != rt::CacheMode::read_write) return "KILN_CACHE is not rw";
  if (!cache.writable()) return "writes to " + cache.dir().string() + " failed (see the warning above)";
  return "the size bound KILN_CACHE_MAX_SIZE=" + human_bytes(cache.max_bytes()) + " evicted them";
}

// Counted at the end, so that a failed write, an eviction or another process's gc all show.
std::size_t count_stored(const rt::DiskCache& cache, const std::vector<std::string>& digests, std::size_t built) {
  std::size_t stored = 0;
  for (const std::string& d : digests) stored += !d.empty() && cache.contains(d);
  if (stored < built)
    warn("stored " + std::to_string(stored) + " of " + std::to_string(built) + " kernels in " + cache.dir().string() +
         "; the others are compiled but not cached (" + unstored_reason(cache) + ")");
  return stored;
}

std::size_t built(const WarmBatch& b) { return static_cast<std::size_t>(b.compiled + b.cached); }

}  // namespace

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

std::string kernel_name(const std::string& op, const std::string& dtypes, std::uint32_t variant,
                        const std::string& label) {
  return label.empty() ? op + " (" + dtypes + ") variant " + std::to_string(variant) : label;
}

int warm_threads(int jobs, std::size_t kernels) {
  if (jobs < 0)
    throw UsageError("--jobs must be 0 (KILN_COMPILE_JOBS, else one per usable CPU up to 16) or more, got " +
                     std::to_string(jobs));
  int threads = jobs;
  if (threads == 0) {
    try {
      threads = rt::compile_jobs();
    } catch (const kiln::ValueError& e) {  // a bad KILN_COMPILE_JOBS: the user's setting, like --jobs
      throw UsageError(e.what());
    }
  }
  return std::max(1, std::min<int>(threads, static_cast<int>(kernels)));
}

rt::DiskCache& open_warm_cache() {
  auto& cache = rt::DiskCache::global();
  if (cache.mode() != rt::CacheMode::read_write)
    warn("KILN_CACHE is not rw: kernels are compiled but not stored in " + cache.dir().string());
  else
    cache.remove_abandoned_temps();  // left by a killed warm; they would never be collected otherwise
  return cache;
}

WarmBatch warm_groups(std::size_t n, const std::vector<std::vector<std::size_t>>& groups, int threads,
                      const Common& common, const rt::DiskCache& cache, const WarmGroup& warm_group) {
  WarmBatch b;
  b.outcomes.resize(n);
  b.digests.resize(n);
  b.errors.resize(n);
  b.logs.resize(n);
  b.ms.assign(n, 0);
  b.threads = threads;
  std::atomic<int> compiled{0}, cached{0}, failed{0};
  auto progress = progress_line(common, "warm", "kernels", n, {"compiled", "cached", "failed"});
  const auto start = std::chrono::steady_clock::now();
  parallel_for(groups.size(), threads, [&](std::size_t g) {
    const std::vector<rt::BundleResult> results = warm_group(groups[g]);
    for (std::size_t j = 0; j < groups[g].size(); ++j) {
      const std::size_t i = groups[g][j];
      const rt::BundleResult& r = results[j];
      b.digests[i] = r.digest;
      if (r.outcome) {
        const bool fresh = *r.outcome == rt::WarmOutcome::compiled;
        b.ms[i] = fresh ? r.ms : 0;
        b.outcomes[i] = fresh ? "compiled" : "cached";
        (fresh ? compiled : cached)++;
        progress.tick(fresh ? 0 : 1);
        continue;
      }
      try {
        std::rethrow_exception(r.error);
      } catch (const std::exception& e) {
        b.errors[i] = first_line(e.what());
        if (const auto* ce = dynamic_cast<const kiln::CompileError*>(&e)) b.logs[i] = ce->log();
      }
      b.digests[i].clear();
      failed++;
      progress.tick(2);
    }
  });
  progress.finish();
  b.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  b.compiled = compiled;
  b.cached = cached;
  b.failed = failed;
  b.stored = count_stored(cache, b.digests, built(b));
  return b;
}

WarmBatch warm_batch(std::size_t n, int threads, const Common& common, const rt::DiskCache& cache,
                     const std::function<rt::WarmOutcome(std::size_t, std::string*)>& warm_one) {
  std::vector<std::vector<std::size_t>> each(n);
  for (std::size_t i = 0; i < n; ++i) each[i] = {i};
  return warm_groups(n, each, threads, common, cache, [&](std::span<const std::size_t> g) {
    return std::vector<rt::BundleResult>{warm_result([&](std::string* digest) { return warm_one(g[0], digest); })};
  });
}

rt::BundleResult warm_result(const std::function<rt::WarmOutcome(std::string*)>& warm) {
  rt::BundleResult r;
  try {
    const auto began = std::chrono::steady_clock::now();
    r.outcome = warm(&r.digest);
    r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
  } catch (...) {
    r.outcome.reset();
    r.error = std::current_exception();
  }
  return r;
}

std::string kernel_family(const std::string& op) {
  // Generated: <kind>_<16 hex digits>, then _<n> for a taken name or a module's later entries.
  for (std::size_t at = op.find('_'); at != std::string::npos; at = op.find('_', at + 1)) {
    const std::size_t end = at + 17;
    if (end <= op.size() && (end == op.size() || op[end] == '_') &&
        std::all_of(op.begin() + static_cast<std::ptrdiff_t>(at + 1), op.begin() + static_cast<std::ptrdiff_t>(end),
                    [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }))
      return op.substr(0, at);
  }
  const rt::KernelSpec* spec = rt::find_kernel(op);
  return spec ? spec->template_name : op;
}

namespace {

Json family_times(const WarmBatch& b, const std::vector<std::string>& families) {
  std::map<std::string, std::vector<double>> by;
  for (std::size_t i = 0; i < b.ms.size() && i < families.size(); ++i)
    if (b.outcomes[i] == "compiled") by[families[i]].push_back(b.ms[i]);
  std::vector<Json> rows;
  for (auto& [family, ms] : by) {
    std::sort(ms.begin(), ms.end());
    const std::size_t n = ms.size();
    const double median = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
    double total = 0;
    for (double m : ms) total += m;
    rows.push_back(Json{{"family", family}, {"compiled", n}, {"median_ms", median}, {"max_ms", ms.back()},
                        {"total_ms", total}});
  }
  std::sort(rows.begin(), rows.end(), [](const Json& x, const Json& y) {
    return x.at("total_ms").get<double>() > y.at("total_ms").get<double>();
  });
  return Json(rows);
}

}  // namespace

std::string family_table(const Json& families) {
  std::string t = "compile milliseconds a kernel, per family (NVRTC in its server and the store, on the kernel's thread):\n";
  char line[160];
  std::snprintf(line, sizeof line, "%-28s %8s %9s %9s %10s\n", "family", "compiled", "median", "max", "total");
  t += line;
  for (const Json& f : families) {
    std::snprintf(line, sizeof line, "%-28s %8d %9.1f %9.1f %10.1f\n", f.at("family").get<std::string>().c_str(),
                  f.at("compiled").get<int>(), f.at("median_ms").get<double>(), f.at("max_ms").get<double>(),
                  f.at("total_ms").get<double>());
    t += line;
  }
  return t;
}

Json warm_summary(Json head, const WarmBatch& b, int arch, const rt::DiskCache& cache,
                  const std::vector<std::string>& families) {
  head["families"] = family_times(b, families);
  head["compiled"] = b.compiled;
  head["cached"] = b.cached;
  head["failed"] = b.failed;
  head["seconds"] = b.seconds;
  head["arch"] = arch_name(arch);
  head["threads"] = b.threads;
  head["cache_dir"] = cache.dir().string();
  head["stored"] = b.stored == built(b);
  head["stored_kernels"] = b.stored;
  return head;
}

std::string warm_counts(const WarmBatch& b, std::size_t failed) {
  return std::to_string(b.compiled) + " compiled, " + std::to_string(b.cached) + " already cached, " +
         std::to_string(failed) + " failed (" + std::to_string(b.threads) + " threads)";
}

int warm_exit(const WarmBatch& b, std::size_t failed, bool allow_unstored) {
  return failed == 0 && (b.stored == built(b) || allow_unstored) ? 0 : kFailureExit;
}

}  // namespace jitcc
