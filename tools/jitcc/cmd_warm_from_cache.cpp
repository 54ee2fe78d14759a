// jitcc warm --from-cache DIR: kernels made at run time (fused kernels, user-defined pointwise
// ops) have no spec jitcc could instantiate, but every cache entry records its source. This
// recompiles those sources for another arch into the cache, so that one training run's cache
// prepares a production image. Built-in kernels are left to plain `warm`.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <set>
#include <tuple>

#include "cli.h"
#include "kiln/error.h"
#include "kiln/runtime/module_cache.h"

namespace jitcc {

namespace rt = kiln::rt;
namespace fs = std::filesystem;

namespace {

struct Recorded {
  rt::Entry entry;
  fs::path path;
};

struct Failure {
  std::string name;  // the kernel's readable name, or the file's when it is unreadable
  fs::path path;
  std::string error, log;
};

// A generated kernel (it has a label) or an op this process has no spec for (user-defined).
bool made_at_run_time(const rt::EntryKey& k) { return !k.label.empty() || !rt::find_kernel(k.op); }

std::string describe(const rt::EntryKey& k) {
  return k.label.empty() ? k.op + " (" + k.dtypes + ") variant " + std::to_string(k.variant) : k.label;
}

}  // namespace

int run_warm_from_cache(const std::string& dir, const std::string& arch_text, int jobs_arg, bool allow_unstored,
                        const Common& common) {
  const fs::path from = fs::absolute(dir);
  std::error_code ec;
  if (!fs::is_directory(from, ec))
    throw UsageError("--from-cache " + from.string() + ": " + (fs::exists(from, ec) ? "not a directory" : "no such directory"));
  const int arch = resolve_arch(arch_text);

  // Read first: DIR may be the cache being filled.
  const rt::DiskCache source(from, rt::CacheMode::read_only, 0);
  std::vector<Recorded> kernels;
  std::vector<Failure> failures;
  std::set<std::tuple<std::string, std::string, std::uint32_t, std::string>> seen;  // one per source, any arch
  std::size_t builtin = 0;
  for (const rt::EntryInfo& info : list_entries(source, common, "warm: reading")) {
    std::string problem = info.problem;
    std::optional<rt::Entry> e;
    if (info.ok && !made_at_run_time(info.key)) {
      ++builtin;
      continue;
    }
    if (info.ok) e = source.read(info.path, &problem);
    if (!e) {
      failures.push_back({info.key.op.empty() ? info.path.filename().string() : describe(info.key), info.path,
                          "unreadable entry: " + problem, ""});
      continue;
    }
    if (seen.emplace(e->key.op, e->key.dtypes, e->key.variant, e->source).second)
      kernels.push_back({std::move(*e), info.path});
  }
  if (kernels.empty() && failures.empty())
    warn(from.string() + " records no kernel made at run time (fused or user-defined)");

  const int threads = warm_threads(jobs_arg, kernels.size());
  auto& cache = open_warm_cache();
  std::vector<std::string> digests(kernels.size()), outcomes(kernels.size());
  std::atomic<int> compiled{0}, cached{0};
  std::mutex mu;
  auto progress = progress_line(common, "warm", "kernels", kernels.size(), {"compiled", "cached", "failed"});
  const auto start = std::chrono::steady_clock::now();
  parallel_for(kernels.size(), threads, [&](std::size_t i) {
    const Recorded& r = kernels[i];
    try {
      const bool fresh = rt::warm_source(r.entry.key, r.entry.source, arch, &digests[i]) == rt::WarmOutcome::compiled;
      outcomes[i] = fresh ? "compiled" : "cached";
      (fresh ? compiled : cached)++;
      progress.tick(fresh ? 0 : 1);
    } catch (const kiln::CompileError& e) {
      std::lock_guard lock(mu);
      failures.push_back({describe(r.entry.key), r.path, first_line(e.what()), e.log()});
      digests[i].clear();
      progress.tick(2);
    } catch (const std::exception& e) {
      std::lock_guard lock(mu);
      failures.push_back({describe(r.entry.key), r.path, first_line(e.what()), ""});
      digests[i].clear();
      progress.tick(2);
    }
  });
  progress.finish();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::size_t built = static_cast<std::size_t>(compiled.load() + cached.load());
  const std::size_t stored = count_stored(cache, digests, built);
  std::sort(failures.begin(), failures.end(), [](const Failure& a, const Failure& b) { return a.path < b.path; });

  std::string text;
  Json list = Json::array(), fails = Json::array();
  for (std::size_t i = 0; i < kernels.size(); ++i) {
    if (outcomes[i].empty()) continue;
    const rt::EntryKey& k = kernels[i].entry.key;
    text += outcomes[i] + " " + describe(k) + " for " + arch_name(arch) + "\n";
    list.push_back(Json{{"name", entry_name(k)},
                        {"op", k.op},
                        {"label", k.label},
                        {"dtypes", k.dtypes},
                        {"variant", k.variant},
                        {"outcome", outcomes[i]},
                        {"digest", digests[i]},
                        {"from", kernels[i].path.string()}});
  }
  for (const Failure& f : failures) {
    std::fprintf(stderr, "jitcc: failed: %s (%s): %s\n%s", f.name.c_str(), f.path.c_str(), f.error.c_str(),
                 f.log.c_str());
    fails.push_back(Json{{"name", f.name}, {"entry", f.path.string()}, {"error", f.error}, {"log", f.log}});
  }
  char line[512];
  std::snprintf(line, sizeof line,
                "%zu kernels from %s for %s in %.2f s: %d compiled, %d already cached, %zu failed (%d threads); "
                "%zu built-in entries left to `jitcc warm`\n",
                kernels.size(), from.c_str(), arch_name(arch).c_str(), seconds, compiled.load(), cached.load(),
                failures.size(), threads, builtin);
  text += line + std::string("cache: ") + cache.dir().string() + "\n";
  emit(common,
       Json{{"from_cache", from.string()},
            {"compiled", compiled.load()},
            {"cached", cached.load()},
            {"failed", failures.size()},
            {"builtin_skipped", builtin},
            {"seconds", seconds},
            {"arch", arch_name(arch)},
            {"threads", threads},
            {"cache_dir", cache.dir().string()},
            {"stored", stored == built},
            {"stored_kernels", stored},
            {"kernels", std::move(list)},
            {"failures", std::move(fails)}},
       text);
  return failures.empty() && (stored == built || allow_unstored) ? 0 : kFailureExit;
}

}  // namespace jitcc
