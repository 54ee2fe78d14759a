// jitcc show --plan FILE: the compiled steps a kernel plan recorded, group by group, as the
// step compiler ran them in the plan's pass: each fused pointwise group with its ops, shape,
// what it writes and why it ended, and each op that runs its own kernel; then the choices the
// tuner will measure at the run's first calls (prefetch_kernels measures the products ahead).
#include <string>

#include "cli.h"
#include "kiln/error.h"
#include "kiln/kernel_plan.h"

namespace jitcc {

namespace {

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out.append(out.empty() ? "" : ", ").append(n);
  return out;
}

}  // namespace

int show_plan_steps(const std::string& file, const Common& common) {
  kiln::KernelPlan plan;
  try {
    plan = kiln::KernelPlan::load(file);
  } catch (const kiln::Error& e) {
    throw UsageError(std::string("--plan ") + e.what());
  }
  if (plan.steps.empty())
    throw UsageError("--plan " + file +
                     " records no compiled step: a plan lists a step's groups when its pass ran a kiln::compile "
                     "function (mnist-train --kernel-plan writes such a plan)");
  Json steps = Json::array();
  std::string text;
  for (const kiln::KernelPlan::Step& s : plan.steps) {
    Json groups = Json::array();
    std::vector<std::vector<std::string>> rows{{"#", "ops", "shape", "runs as", "ended because"}};
    std::size_t fused = 0;
    for (std::size_t i = 0; i < s.groups.size(); ++i) {
      const kiln::KernelPlan::Group& g = s.groups[i];
      fused += g.ops.size() > 1;
      groups.push_back(Json{{"ops", g.ops}, {"shape", g.shape}, {"result", g.result}, {"ended", g.ended}});
      rows.push_back({std::to_string(i + 1), joined(g.ops), g.shape, g.result, g.ended});
    }
    steps.push_back(Json{{"signature", s.signature}, {"groups", std::move(groups)}});
    text += "step " + s.signature + ": " + std::to_string(s.groups.size()) + " groups, " + std::to_string(fused) +
            " of them fused\n" + table(rows) + "\n";
  }
  Json measurements = Json::array();
  std::vector<std::vector<std::string>> rows{{"site", "problem", "dtypes"}};
  for (const kiln::KernelPlan::Measurement& m : plan.measurements) {
    measurements.push_back(Json{{"site", m.site}, {"problem", m.problem}, {"dtypes", m.dtypes}});
    rows.push_back({m.site, m.problem, m.dtypes});
  }
  text += std::to_string(plan.measurements.size()) + (plan.measurements.size() == 1 ? " choice" : " choices") +
          " the tuner will measure at a first call" + (plan.measurements.empty() ? "\n" : ":\n" + table(rows));
  emit(common, Json{{"plan", file}, {"steps", std::move(steps)}, {"measurements", std::move(measurements)}}, text);
  return 0;
}

}  // namespace jitcc
