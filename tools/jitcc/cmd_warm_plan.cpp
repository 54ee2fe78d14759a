// jitcc warm --plan FILE: compiles the kernels a run's plan lists (mnist-train --kernel-plan,
// or kiln::plan_kernels and KernelPlan::save) for --arch, so that run compiles nothing: kernels
// shipped with kiln are instantiated from this kiln's templates, generated ones (fused,
// per-shape) rebuilt from the source the plan recorded.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>

#include "cli.h"
#include "kiln/error.h"
#include "kiln/kernel_plan.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/module_cache.h"

namespace jitcc {

namespace rt = kiln::rt;

namespace {

std::string describe(const kiln::KernelPlan::Kernel& k) {
  return k.label.empty() ? k.op + " (" + k.dtypes + ") variant " + std::to_string(k.variant) : k.label;
}

// One kernel of the plan into the cache; throws what the compile throws.
rt::WarmOutcome warm_planned(const kiln::KernelPlan::Kernel& k, int arch, std::string* digest) {
  const kiln::DTypes dtypes = kiln::DTypes::parse(k.dtypes);
  if (k.label.empty()) {
    const rt::KernelSpec* spec = rt::find_kernel(k.op);
    if (!spec) throw kiln::ValueError("this kiln has no kernel '" + k.op + "' (a plan of another version?)");
    return rt::warm_kernel(*spec, dtypes, k.variant, arch, digest);
  }
  rt::EntryKey key;
  key.op = k.op;
  key.dtypes = dtypes.str();
  key.variant = k.variant;
  key.label = k.label;
  return rt::warm_source(key, k.source, arch, digest);
}

}  // namespace

int run_warm_plan(const std::string& file, const std::string& arch_text, int jobs_arg, bool allow_unstored,
                  const Common& common) {
  kiln::KernelPlan plan;
  try {
    plan = kiln::KernelPlan::load(file);
  } catch (const kiln::Error& e) {
    throw UsageError(std::string("--plan ") + e.what());
  }
  const int arch = resolve_arch(arch_text);
  const int threads = warm_threads(jobs_arg, plan.kernels.size());
  auto& cache = open_warm_cache();
  std::vector<std::string> digests(plan.kernels.size()), failures(plan.kernels.size());
  std::atomic<int> compiled{0}, cached{0}, failed{0};
  auto progress = progress_line(common, "warm", "kernels", plan.kernels.size(), {"compiled", "cached", "failed"});
  const auto start = std::chrono::steady_clock::now();
  parallel_for(plan.kernels.size(), threads, [&](std::size_t i) {
    try {
      const bool fresh = warm_planned(plan.kernels[i], arch, &digests[i]) == rt::WarmOutcome::compiled;
      (fresh ? compiled : cached)++;
      progress.tick(fresh ? 0 : 1);
    } catch (const std::exception& e) {
      failures[i] = first_line(e.what());
      digests[i].clear();
      failed++;
      progress.tick(2);
    }
  });
  progress.finish();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::size_t built = plan.kernels.size() - static_cast<std::size_t>(failed.load());
  const std::size_t stored = count_stored(cache, digests, built);

  Json fails = Json::array();
  for (std::size_t i = 0; i < plan.kernels.size(); ++i) {
    if (failures[i].empty()) continue;
    std::fprintf(stderr, "jitcc: failed: %s: %s\n", describe(plan.kernels[i]).c_str(), failures[i].c_str());
    fails.push_back(Json{{"name", describe(plan.kernels[i])}, {"error", failures[i]}});
  }
  char line[512];
  std::snprintf(line, sizeof line,
                "%zu kernels from the plan %s for %s in %.2f s: %d compiled, %d already cached, %d failed (%d threads)\n",
                plan.kernels.size(), file.c_str(), arch_name(arch).c_str(), seconds, compiled.load(), cached.load(),
                failed.load(), threads);
  emit(common,
       Json{{"plan", file},
            {"compiled", compiled.load()},
            {"cached", cached.load()},
            {"failed", failed.load()},
            {"seconds", seconds},
            {"kernels", plan.kernels.size()},
            {"arch", arch_name(arch)},
            {"threads", threads},
            {"cache_dir", cache.dir().string()},
            {"stored", stored == built},
            {"stored_kernels", stored},
            {"failures", std::move(fails)}},
       line + std::string("cache: ") + cache.dir().string() + "\n");
  return failed.load() == 0 && (stored == built || allow_unstored) ? 0 : kFailureExit;
}

}  // namespace jitcc
