// jitcc warm: compiles every selected registered instantiation into the disk cache,
// so that a production process compiles nothing (--from-cache: cmd_warm_from_cache.cpp).
#include <algorithm>
#include <cstdio>
#include <memory>

#include "warm_batch.h"

namespace jitcc {

namespace rt = kiln::rt;

namespace {

struct WarmArgs {
  std::string ops = "all";
  std::string dtypes = "all";
  WarmOptions o{"auto"};
  std::optional<std::string> from_cache;  // a cache directory whose run-time kernels to rebuild
  std::optional<std::string> plan;        // a kernel plan file whose kernels to build
};

struct Job {
  const rt::KernelSpec* spec;
  kiln::DTypes dtypes;
  std::uint32_t variant;
};

std::vector<Job> select_jobs(const WarmArgs& a) {
  auto specs = select_kernels(a.ops);
  auto filter = parse_dtype_filter(a.dtypes);
  std::vector<Job> jobs;
  for (const auto* spec : specs) {
    for (const kiln::DTypes& d : spec->dtypes) {
      bool keep = true;
      for (int i = 0; filter && i < d.size(); ++i)
        keep = keep && std::find(filter->begin(), filter->end(), d[i]) != filter->end();
      if (!keep) continue;
      for (std::uint32_t v : spec->variants) jobs.push_back({spec, d, v});
    }
  }
  if (jobs.empty()) throw UsageError("no registered instantiation matches --ops " + a.ops + " --dtypes " + a.dtypes);
  return jobs;
}

int run_warm(const WarmArgs& a, const Common& common) {
  apply_cache_dir(common);
  if (a.o.bundle < 1) throw UsageError("--bundle must be 1 or more, got " + std::to_string(a.o.bundle));
  if (a.from_cache) return run_warm_from_cache(*a.from_cache, a.o, common);
  if (a.plan) return run_warm_plan(*a.plan, a.o, common);
  warm_threads(a.o.jobs, 1);  // a bad --jobs is reported before the kernels are selected
  const std::vector<Job> jobs = select_jobs(a);
  const int arch = resolve_arch(a.o.arch);
  std::vector<rt::BundleItem> items;
  for (const Job& j : jobs) items.push_back({j.spec, j.dtypes, j.variant});
  const auto groups = rt::bundle_groups(items, static_cast<std::size_t>(a.o.bundle));
  const int threads = warm_threads(a.o.jobs, groups.size());
  auto& cache = open_warm_cache();
  const WarmBatch b = warm_groups(jobs.size(), groups, threads, common, cache, [&](std::span<const std::size_t> g) {
    std::vector<rt::BundleItem> members;
    for (std::size_t i : g) members.push_back(items[i]);
    return rt::warm_bundle(members, arch);
  });

  Json fails = Json::array();
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    if (!b.outcomes[i].empty()) continue;
    const Job& j = jobs[i];
    fails.push_back(Json{{"op", j.spec->op},
                         {"dtypes", j.dtypes.str()},
                         {"variant", j.variant},
                         {"error", b.errors[i]},
                         {"log", b.logs[i]}});
    std::fprintf(stderr, "jitcc: failed: %s: %s\n%s", kernel_name(j.spec->op, j.dtypes.str(), j.variant).c_str(),
                 b.errors[i].c_str(), b.logs[i].c_str());
  }
  char line[128];
  std::snprintf(line, sizeof line, "%zu kernels for %s in %.2f s: ", jobs.size(), arch_name(arch).c_str(), b.seconds);
  std::vector<std::string> families;
  for (const Job& j : jobs) families.push_back(j.spec->template_name);
  Json summary = warm_summary(Json{{"kernels", jobs.size()}}, b, arch, cache, families);
  summary["failures"] = std::move(fails);
  summary["programs"] = groups.size();
  emit(common, summary,
       line + warm_counts(b, b.failed) + "\ncache: " + cache.dir().string() + "\n" +
           (a.o.timings ? family_table(summary.at("families")) : ""));
  return warm_exit(b, b.failed, a.o.allow_unstored);
}

}  // namespace

void add_warm(CLI::App& app, Context& ctx) {
  auto args = std::make_shared<WarmArgs>();
  auto* sub = app.add_subcommand(
      "warm", "Compile registered kernels (or, with --from-cache, the kernels another cache recorded) into the disk cache");
  auto* ops =
      sub->add_option("--ops", args->ops, "Comma-separated op names, or all")->capture_default_str()->check(not_a_flag());
  auto* dtypes = sub->add_option("--dtypes", args->dtypes,
                                 "Comma-separated dtypes: keeps instantiations whose dtypes are all listed, or all")
                     ->capture_default_str()
                     ->check(not_a_flag());
  sub->add_option("--from-cache", args->from_cache,
                  "Instead: recompile the kernels made at run time (fused, user-defined ops) whose sources the "
                  "cache DIR recorded, e.g. by a training run, for --arch")
      ->type_name("DIR")
      ->check(not_a_flag())
      ->excludes(ops)
      ->excludes(dtypes);
  sub->add_option("--plan", args->plan,
                  "Instead: compile exactly the kernels a run's plan FILE lists (mnist-train --kernel-plan FILE), "
                  "fused and per-shape ones included, for --arch")
      ->type_name("FILE")
      ->check(not_a_flag())
      ->excludes(ops)
      ->excludes(dtypes)
      ->excludes("--from-cache");
  sub->add_option("--arch", args->o.arch, "Target arch (sm_90), or auto for GPU 0")
      ->capture_default_str()
      ->check(not_a_flag());
  sub->add_option("--bundle", args->o.bundle,
                  "kiln's own kernels compiled together in one NVRTC program at most (1: each alone; with --plan "
                  "too); each keeps its own cache entry")
      ->capture_default_str()
      ->excludes("--from-cache");
  sub->add_option("--jobs,-j", args->o.jobs, "Parallel compiles; 0 (the default): KILN_COMPILE_JOBS, else one per usable CPU up to 16");
  sub->add_flag("--allow-unstored", args->o.allow_unstored,
                "Exit 0 even when some kernels could not be stored (read-only, full or too small cache)");
  sub->add_flag("--timings", args->o.timings,
                "Also print the compile milliseconds a kernel per family (template or generated kind), the "
                "costliest first");
  add_common_options(*sub, ctx.common);
  sub->callback([args, &ctx] { ctx.run = [args, &ctx] { return run_warm(*args, ctx.common); }; });
}

}  // namespace jitcc
