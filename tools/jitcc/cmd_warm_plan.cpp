// jitcc warm --plan FILE: compiles the kernels a run's plan lists (mnist-train --kernel-plan,
// or kiln::plan_kernels and KernelPlan::save) for --arch, so that run compiles nothing: kernels
// shipped with kiln are instantiated from this kiln's templates, generated ones (fused,
// per-shape) rebuilt from the source the plan recorded.
#include <cstdio>
#include <optional>

#include "kiln/error.h"
#include "kiln/kernel_plan.h"
#include "kiln/runtime/kernel_registry.h"
#include "warm_batch.h"

namespace jitcc {

namespace rt = kiln::rt;

namespace {

constexpr std::size_t kNoItem = static_cast<std::size_t>(-1);

std::string describe(const kiln::KernelPlan::Kernel& k) { return kernel_name(k.op, k.dtypes, k.variant, k.label); }

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

int run_warm_plan(const std::string& file, const WarmOptions& o, const Common& common) {
  kiln::KernelPlan plan;
  try {
    plan = kiln::KernelPlan::load(file);
  } catch (const kiln::Error& e) {
    throw UsageError(std::string("--plan ") + e.what());
  }
  const int arch = resolve_arch(o.arch);
  // kiln's own kernels share programs as a full warm's do (bundles); generated ones compile alone.
  std::vector<rt::BundleItem> items;
  std::vector<std::size_t> item_of(plan.kernels.size(), kNoItem), kernel_of;  // plan index <-> item index
  std::vector<std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < plan.kernels.size(); ++i) {
    const kiln::KernelPlan::Kernel& k = plan.kernels[i];
    const rt::KernelSpec* spec = k.label.empty() ? rt::find_kernel(k.op) : nullptr;
    std::optional<kiln::DTypes> dtypes;
    try {
      if (spec) dtypes = kiln::DTypes::parse(k.dtypes);
    } catch (const kiln::Error&) {  // warm_planned reports it for this kernel
    }
    if (!dtypes) {
      groups.push_back({i});  // generated, unknown to this kiln or malformed: warm_planned says so
      continue;
    }
    item_of[i] = items.size();
    kernel_of.push_back(i);
    items.push_back({spec, *dtypes, k.variant});
  }
  for (std::vector<std::size_t>& g : rt::bundle_groups(items, static_cast<std::size_t>(o.bundle))) {
    for (std::size_t& i : g) i = kernel_of[i];
    groups.push_back(std::move(g));
  }
  auto& cache = open_warm_cache();
  const WarmBatch b = warm_groups(plan.kernels.size(), groups, warm_threads(o.jobs, groups.size()), common, cache,
                                  [&](std::span<const std::size_t> g) {
                                    if (item_of[g[0]] == kNoItem)
                                      return std::vector<rt::BundleResult>{warm_result([&](std::string* digest) {
                                        return warm_planned(plan.kernels[g[0]], arch, digest);
                                      })};
                                    std::vector<rt::BundleItem> members;
                                    for (std::size_t i : g) members.push_back(items[item_of[i]]);
                                    return rt::warm_bundle(members, arch);
                                  });

  Json fails = Json::array();
  for (std::size_t i = 0; i < plan.kernels.size(); ++i) {
    if (!b.outcomes[i].empty()) continue;
    std::fprintf(stderr, "jitcc: failed: %s: %s\n%s", describe(plan.kernels[i]).c_str(), b.errors[i].c_str(),
                 b.logs[i].c_str());
    fails.push_back(Json{{"name", describe(plan.kernels[i])}, {"error", b.errors[i]}, {"log", b.logs[i]}});
  }
  char head[64];
  std::snprintf(head, sizeof head, " for %s in %.2f s: ", arch_name(arch).c_str(), b.seconds);
  std::vector<std::string> families;
  for (const kiln::KernelPlan::Kernel& k : plan.kernels) families.push_back(kernel_family(k.op));
  Json summary = warm_summary(Json{{"plan", file}, {"kernels", plan.kernels.size()}}, b, arch, cache, families);
  summary["failures"] = std::move(fails);
  summary["programs"] = groups.size();
  emit(common, summary,
       std::to_string(plan.kernels.size()) + " kernels from the plan " + file + head + warm_counts(b, b.failed) +
           "\ncache: " + cache.dir().string() + "\n" + (o.timings ? family_table(summary.at("families")) : ""));
  return warm_exit(b, b.failed, o.allow_unstored);
}

}  // namespace jitcc
