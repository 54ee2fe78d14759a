#pragma once
// Cold starts without a stall. A shape-only pass lists the kernels a piece of work will ask
// for (per-shape and fused kernels included) without running it; prefetch_kernels compiles and
// loads that list on every core before the work needs it; a saved plan lets `jitcc warm --plan`
// build the same kernels ahead of time, for this GPU or another.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kiln/device.h"

namespace kiln {

struct KernelPlan {
  struct Kernel {
    std::string op;      // the kernel's registered name (a generated kernel's is its module's entry)
    std::string dtypes;  // "f32,bf16"
    std::uint32_t variant = 0;
    std::string label;   // a generated kernel's readable name ("fused(mul,relu) f32"); empty for templates
    std::string source;  // the instantiated source: a generated kernel is rebuilt from it
    bool late = false;   // an alternative the tuner measures, which a run may never launch
  };
  std::vector<Kernel> kernels;

  // One group of a compiled step: a fused pointwise group, or an op that runs its own kernel.
  struct Group {
    std::vector<std::string> ops;  // "mul", "add", "relu" in the order they run; one for an op alone
    std::string shape;             // the group's result shape, "(64,32)"
    std::string result;            // what runs: "one kernel writing 1 of 3 results", "its own kernel: ..."
    std::string ended;             // why a pointwise group ended where it did; empty for an op alone
  };
  // The groups of each compiled step the pass ran (its capturing call's), in the order they run.
  // Work launched outside ops (the input copy, the optimizers' kernels) is not listed.
  struct Step {
    std::string signature;  // the compiled call's: grad mode, device, and each input's dtype and shape
    std::vector<Group> groups;
  };
  std::vector<Step> steps;
  // A choice the tuner will make by measuring at the run's first call (none is remembered): the
  // tune key's site ("cublaslt" for a product through cuBLASLt), problem and dtypes, as
  // `jitcc show --tune` prints them. prefetch_kernels measures the products ahead of the run.
  struct Measurement {
    std::string site, problem, dtypes;
    bool operator==(const Measurement&) const = default;
  };
  std::vector<Measurement> measurements;

  // Adds other's kernels and measurements that this plan lacks, and its steps.
  void merge(const KernelPlan& other);
  // A JSON file ({"kiln_kernel_plan": 1, "kernels": [...]}), written atomically.
  void save(const std::string& path) const;
  // Throws IoError for an unreadable file and ValueError for one that is not a kernel plan.
  static KernelPlan load(const std::string& path);
};

// Runs fn as a shape-only pass for `device`: ops check their arguments, allocate and pick their
// kernels, but nothing runs on the GPU and reads from it give zeros. The pass needs no CUDA
// context, only the device's properties: its allocations are addresses without memory, its
// stream has no driver stream behind it and cuBLASLt is not asked, so it can run while
// open_device_async creates the context. A compiled function called in the pass runs twice,
// as its first (eager) call and its capturing call do, fused kernels and the capture's own
// kernels included, and keeps no state of its own. fn should work on state it can throw away (a
// model and optimizer built for the pass): host-side state it changes, such as an optimizer's
// step count, stays changed, and a tensor it made that outlives it (an optimizer's slot, a
// gradient) takes zeroed memory at its first use. The default generator is left as it was.
KernelPlan plan_kernels(const std::function<void()>& fn, Device device);

// Compiles and loads the plan's kernels for `device` on `threads` background threads (0:
// KILN_COMPILE_JOBS, else the usable CPUs but one, so the run keeps a core, up to 16 a node
// shared among its ranks, and at most one per 2 of the plan's kernels, as servers starting
// together slow each other) and returns at once; a first use of one still loading waits for it.
// Generated kernels this process has not made yet are compiled into the disk cache, where
// their first use finds them. The plan's cuBLASLt measurements run on another background
// thread once the device's context is open, on scratch operands, and stop when the run
// launches its first product (so none shares the GPU with training); the run measures the rest.
void prefetch_kernels(const KernelPlan& plan, Device device, int threads = 0);

}  // namespace kiln
