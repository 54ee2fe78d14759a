// jitcc warm --from-cache DIR: kernels made at run time (fused kernels, user-defined pointwise
// ops) have no spec jitcc could instantiate, but every cache entry records its source. This
// recompiles those sources for another arch into the cache, so that one training run's cache
// prepares a production image. Built-in kernels are left to plain `warm`.
#include <algorithm>
#include <cstdio>
#include <set>
#include <tuple>

#include "kiln/runtime/tuning.h"
#include "warm_batch.h"

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

std::string describe(const rt::EntryKey& k) { return kernel_name(k.op, k.dtypes, k.variant, k.label); }

}  // namespace

int run_warm_from_cache(const std::string& dir, const WarmOptions& o, const Common& common) {
  const fs::path from = fs::absolute(dir);
  std::error_code ec;
  if (!fs::is_directory(from, ec))
    throw UsageError("--from-cache " + from.string() + ": " + (fs::exists(from, ec) ? "not a directory" : "no such directory"));
  const int arch = resolve_arch(o.arch);

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
    if (info.ok && info.key.kind == rt::kTuneKind) continue;  // a measured choice, no kernel to compile
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

  auto& cache = open_warm_cache();
  const WarmBatch b = warm_batch(kernels.size(), warm_threads(o.jobs, kernels.size()), common, cache,
                                 [&](std::size_t i, std::string* digest) {
                                   return rt::warm_source(kernels[i].entry.key, kernels[i].entry.source, arch, digest);
                                 });
  for (std::size_t i = 0; i < kernels.size(); ++i)
    if (b.outcomes[i].empty())
      failures.push_back({describe(kernels[i].entry.key), kernels[i].path, b.errors[i], b.logs[i]});
  std::sort(failures.begin(), failures.end(), [](const Failure& x, const Failure& y) { return x.path < y.path; });

  std::string text;
  Json list = Json::array(), fails = Json::array();
  for (std::size_t i = 0; i < kernels.size(); ++i) {
    if (b.outcomes[i].empty()) continue;
    const rt::EntryKey& k = kernels[i].entry.key;
    text += b.outcomes[i] + " " + describe(k) + " for " + arch_name(arch) + "\n";
    list.push_back(Json{{"name", entry_name(k)},
                        {"op", k.op},
                        {"label", k.label},
                        {"dtypes", k.dtypes},
                        {"variant", k.variant},
                        {"outcome", b.outcomes[i]},
                        {"digest", b.digests[i]},
                        {"from", kernels[i].path.string()}});
  }
  for (const Failure& f : failures) {
    std::fprintf(stderr, "jitcc: failed: %s (%s): %s\n%s", f.name.c_str(), f.path.c_str(), f.error.c_str(),
                 f.log.c_str());
    fails.push_back(Json{{"name", f.name}, {"entry", f.path.string()}, {"error", f.error}, {"log", f.log}});
  }
  char line[128];
  std::snprintf(line, sizeof line, " for %s in %.2f s: ", arch_name(arch).c_str(), b.seconds);
  text += std::to_string(kernels.size()) + " kernels from " + from.string() + line + warm_counts(b, failures.size()) +
          "; " + std::to_string(builtin) + " built-in entries left to `jitcc warm`\ncache: " + cache.dir().string() + "\n";
  std::vector<std::string> families;
  for (const Recorded& r : kernels) families.push_back(kernel_family(r.entry.key.op));
  Json summary = warm_summary(Json{{"from_cache", from.string()}}, b, arch, cache, families);
  if (o.timings) text += family_table(summary.at("families"));
  summary["failed"] = failures.size();  // unreadable entries too
  summary["builtin_skipped"] = builtin;
  summary["kernels"] = std::move(list);
  summary["failures"] = std::move(fails);
  emit(common, summary, text);
  return warm_exit(b, failures.size(), o.allow_unstored);
}

}  // namespace jitcc
