// Programmatic dependent launch: on sm_90 kiln's kernels are launched before the kernel ahead
// of them has finished and wait for it in their first statement. Chains whose kernels read what the one
// before wrote, and write what it read, give the CPU's bits with it on and off; captured,
// their graphs have programmatic edges only while it is on.
#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "backend/cuda/launch_common.h"
#include "gpu_match.h"
#include "kiln/kiln.h"
#include "kiln/runtime/module_cache.h"
#include "programmatic_launch.h"

using namespace kiln;
using kiln_test::f32_bits;
using kiln_test::kGpu;
using kiln_test::launches_early;
using kiln_test::ProgrammaticLaunch;

namespace {

// 120 kernels on two 4M-element tensors, each reading the tensor the one before it wrote and
// writing one it read; the temporaries' blocks are freed and taken again in stream order.
void dependent_chain(Tensor& a, Tensor& b) {
  for (int i = 0; i < 40; ++i) {
    a.add_(b);
    const Tensor half = a * 0.5f;
    b.sub_(half);
  }
}

}  // namespace

TEST_CASE("programmatic launch: kiln's kernels are loaded as waiting for prior grids on sm_90") {
  const rt::Function f = rt::get_function(kernels::kernel("add"), DTypes{DType::f32, DType::f32}, 0, 0);
  CHECK(f.waits_for_prior_grids == launches_early());
}

TEST_CASE("programmatic launch: a chain of dependent kernels gives the CPU's bits with it on and off") {
  Generator g(17);
  const Tensor a0 = randn({1 << 22}, {}, &g), b0 = randn({1 << 22}, {}, &g);
  Tensor ca = a0.clone(), cb = b0.clone();
  dependent_chain(ca, cb);
  for (bool on : {true, false}) {
    CAPTURE(on);
    const ProgrammaticLaunch scope(on);
    Tensor a = a0.to(kGpu), b = b0.to(kGpu);
    dependent_chain(a, b);
    CHECK(f32_bits(a) == f32_bits(ca));
    CHECK(f32_bits(b) == f32_bits(cb));
  }
}

TEST_CASE("programmatic launch: a captured chain has programmatic edges only while it is on, and replays exactly") {
  Generator g(23);
  const Tensor a0 = randn({1 << 20}, {}, &g), b0 = randn({1 << 20}, {}, &g);
  for (bool on : {true, false}) {
    CAPTURE(on);
    const ProgrammaticLaunch scope(on);
    // Unfused: one kernel an op, so the graph is the chain itself.
    CompiledFunction cf = compile(
        [](const std::vector<Tensor>& in) {
          Tensor a = in[0].clone(), b = in[1].clone();
          dependent_chain(a, b);
          return std::vector<Tensor>{a, b};
        },
        {.fuse = false});
    const Tensor a = a0.to(kGpu), b = b0.to(kGpu);
    for (int call = 0; call < 4; ++call) {
      CAPTURE(call);
      const std::vector<Tensor> out = cf({a, b});
      Tensor ca = a0.clone(), cb = b0.clone();
      dependent_chain(ca, cb);
      CHECK(f32_bits(out[0]) == f32_bits(ca));
      CHECK(f32_bits(out[1]) == f32_bits(cb));
    }
    const CompileStats st = cf.stats();
    REQUIRE(st.programmatic_edges_per_graph.size() == 1);
    REQUIRE(st.kernels_per_graph.size() == 1);
    CHECK(st.kernels_per_graph[0] >= 120);
    if (on && launches_early()) {
      // Every op's kernel follows another kiln kernel.
      CHECK(st.programmatic_edges_per_graph[0] >= 120);
      CHECK(st.programmatic_edges_per_graph[0] < st.kernels_per_graph[0]);
    } else {
      CHECK(st.programmatic_edges_per_graph[0] == 0);
    }
  }
}
