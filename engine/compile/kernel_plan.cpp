// plan_kernels and prefetch_kernels (kiln/kernel_plan.h): a shape-only pass (a compiled
// function called inside it runs as its first, eager call does) and the background loads of
// what it found.
#include "kiln/kernel_plan.h"

#include "backend/cuda/gemm_lt_ahead.h"
#include "backend/cuda/tuner.h"
#include "kiln/error.h"
#include "kiln/random.h"
#include "kiln/runtime/compile_jobs.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/kernel_plan.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/templates.h"
#include "step_groups.h"

namespace kiln {

namespace {

// The default generator's place, put back after the pass: a pass draws nothing for real.
class KeepDefaultGenerator {
 public:
  KeepDefaultGenerator() : seed_(default_generator().seed()), offset_(default_generator().offset()) {}
  ~KeepDefaultGenerator() {
    Generator& g = default_generator();
    if (g.seed() != seed_) g.manual_seed(seed_);
    g.set_offset(offset_);
  }

 private:
  std::uint64_t seed_, offset_;
};

}  // namespace

KernelPlan plan_kernels(const std::function<void()>& fn, Device device) {
  if (!fn) throw ValueError("[plan_kernels] the function is empty");
  if (!device.is_cuda()) throw DeviceError("[plan_kernels] plans GPU kernels; " + device.str() + " has none");
  KeepDefaultGenerator keep;
  std::vector<rt::KernelRequest> requests;
  std::vector<KernelPlan::Step> steps;
  {
    rt::ShapeOnlyPass pass;
    compile_detail::PlanSteps planned;
    (void)kernels::take_planned_measurements();  // a pass of this thread before, not planned
    fn();
    requests = pass.requests();
    steps = planned.take();
  }
  // A generated module's entries share one source and cache entry, named for the module.
  KernelPlan plan;
  for (const rt::KernelRequest& r : requests) {
    KernelPlan::Kernel k{rt::kernel_source_name(*r.spec),
                         r.dtypes.str(),
                         r.variant,
                         rt::generated_template_label(r.spec->template_name).value_or(""),
                         "",
                         r.late};
    bool known = false;
    for (const KernelPlan::Kernel& have : plan.kernels)
      known = known || (have.op == k.op && have.dtypes == k.dtypes && have.variant == k.variant);
    if (known) continue;
    k.source = rt::instantiate_kernel(*r.spec, r.dtypes, r.variant);
    plan.kernels.push_back(std::move(k));
  }
  plan.steps = std::move(steps);
  for (kernels::PlannedMeasurement& m : kernels::take_planned_measurements())
    plan.measurements.push_back({std::move(m.site), std::move(m.problem), std::move(m.dtypes)});
  return plan;
}

void prefetch_kernels(const KernelPlan& plan, Device device, int threads) {
  if (!device.is_cuda()) throw DeviceError("[prefetch_kernels] loads GPU kernels; " + device.str() + " has none");
  // In the plan's order, which is the order the pass asked for them: a run's first step needs
  // the first ones first (longest-first made a capture wait behind the evaluation's convs).
  std::vector<rt::KernelRequest> known;
  std::vector<rt::SourceRequest> generated;
  for (const KernelPlan::Kernel& k : plan.kernels) {
    const DTypes dtypes = DTypes::parse(k.dtypes);
    if (const rt::KernelSpec* spec = rt::find_kernel(k.op)) {
      known.push_back({spec, dtypes, k.variant, device.index(), k.late});
      // A generated module's further entries (named <module>_1, _2, ...) load from the same entry.
      for (int i = 1; !k.label.empty(); ++i) {
        const rt::KernelSpec* more = rt::find_kernel(k.op + "_" + std::to_string(i));
        if (!more || more->template_name != spec->template_name) break;
        known.push_back({more, dtypes, k.variant, device.index(), k.late});
      }
    } else if (!k.label.empty()) {
      rt::EntryKey key;
      key.op = k.op;
      key.dtypes = dtypes.str();
      key.variant = k.variant;
      key.label = k.label;
      generated.push_back({std::move(key), k.source, rt::device_info(device.index()).arch()});
    } else {
      throw ValueError("[prefetch_kernels] the plan names kernel '" + k.op + "', which this kiln does not have");
    }
  }
  if (threads == 0) threads = rt::prefetch_jobs(plan.kernels.size());
  rt::prefetch(std::move(known), threads);
  rt::prefetch_sources(std::move(generated), threads);
  std::vector<std::pair<std::string, std::string>> products;
  for (const KernelPlan::Measurement& m : plan.measurements)
    if (m.site == "cublaslt") products.emplace_back(m.problem, m.dtypes);
  kernels::measure_products_ahead(std::move(products), device.index());
}

}  // namespace kiln
