// The quick tier (kiln/runtime/quick_tier.h): a kernel no cache holds runs its quick build at
// once; its full build compiles on the prefetch threads, goes into the disk cache and replaces
// the quick one in later calls and, at its next launch, in a graph captured with it. Results
// match an f64 reference within float rounding, either build.
#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kiln/runtime/compile_jobs.h"
#include "kiln/runtime/compiler.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/generated_kernels.h"
#include "kiln/runtime/graph.h"
#include "kiln/runtime/kernel_plan.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/memory.h"
#include "kiln/runtime/quick_tier.h"
#include "process.h"
#include "quick_tier_on.h"

using namespace kiln;
using namespace kiln::rt;
namespace fs = std::filesystem;

namespace {

constexpr int kN = 1 << 14;
constexpr int kTerms = 16;

// Every prefetch thread busy until release(): a full build queued meanwhile waits behind them.
class HoldPrefetch {
 public:
  HoldPrefetch() {
    const std::shared_future<void> go = go_.get_future().share();
    for (int i = 0; i < background_compile_jobs(); ++i) run_in_background([go] { go.wait(); });
  }
  ~HoldPrefetch() { release(); }
  void release() {
    if (!released_) go_.set_value();
    released_ = true;
  }

 private:
  std::promise<void> go_;
  bool released_ = false;
};

// A polynomial by Horner's rule in a kernel whose source no cache holds: it names this process
// and instant, so the first call compiles.
std::span<const KernelSpec* const> fresh_poly_module() {
  const std::string tag = "pid " + std::to_string(::getpid()) + " t " +
                          std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  return generated_kernels(GeneratedKey("test_quick_tier").add(fnv1a64(tag)), [&] {
    return GeneratedModule{"// " + tag + "\n" +
                               "extern \"C\" __global__ void kiln_test_poly(const float* x, float* y, int n) {\n"
                               "  const int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                               "  if (i >= n) return;\n"
                               "  const float v = x[i];\n"
                               "  float acc = 0.f;\n"
                               "#pragma unroll\n"
                               "  for (int k = 0; k < " +
                               std::to_string(kTerms) +
                               "; ++k) acc = acc * v + (k + 1) * 0.125f;\n"
                               "  y[i] = acc;\n"
                               "}\n",
                           "test quick tier poly",
                           {"kiln_test_poly"}};
  });
}

struct Poly {
  Stream s = Stream::create(0);
  DeviceBuffer x{kN * sizeof(float), s}, y{kN * sizeof(float), s};
  std::vector<float> host_x = std::vector<float>(kN);

  Poly() {
    for (int i = 0; i < kN; ++i) host_x[i] = -1.f + 2.f * static_cast<float>(i) / kN;
    copy_to_device(x.ptr(), host_x.data(), kN * sizeof(float), s);
  }
  void launch_with(const Function& f) {
    const int n = kN;
    launch(f, linear_config(kN), s, x.ptr(), y.ptr(), n);
  }
  std::vector<float> read() {
    std::vector<float> out(kN);
    copy_to_host(out.data(), y.ptr(), kN * sizeof(float), s);
    memset_device(y.ptr(), 0, kN * sizeof(float), s);
    return out;
  }
  // Within float rounding of the f64 polynomial, every element.
  void check(const std::vector<float>& got, const char* what) {
    int bad = 0;
    for (int i = 0; i < kN; ++i) {
      double want = 0;
      for (int k = 0; k < kTerms; ++k) want = want * host_x[i] + (k + 1) * 0.125;
      bad += std::abs(got[i] - want) > 1e-5 * (1 + std::abs(want));
    }
    CAPTURE(what);
    CHECK(bad == 0);
  }
};

}  // namespace

TEST_CASE("quick tier: a kernel no cache holds runs its quick build, then its full build, in calls and in a graph") {
  const kiln_test::QuickTierOn on;
  if (quick_tier_options().empty()) return;  // this NVRTC has no fast-compile mode: no tier
  Poly p;
  const auto module = fresh_poly_module();
  const CacheCounters before = cache_counters();
  HoldPrefetch hold;  // the full build waits until the graph below is captured

  const Function quick = generated_function(module, "kiln_test_poly", 0);
  CHECK(is_quick_build(quick));
  CHECK(cache_counters().quick_compiles == before.quick_compiles + 1);
  CHECK_FALSE(function_if_cached(*module[0], generated_dtypes(), 0, 0));  // not stored: nothing on disk
  p.launch_with(quick);
  const std::vector<float> from_quick = p.read();
  p.check(from_quick, "quick build, called");

  begin_capture(p.s);
  p.launch_with(generated_function(module, "kiln_test_poly", 0));
  Graph g = Graph::end_capture(p.s);
  CHECK(g.quick_builds() == 1);
  g.launch(p.s);
  p.check(p.read(), "quick build, replayed");
  CHECK(g.quick_builds() == 1);  // no full build yet: nothing to swap

  hold.release();
  wait_for_prefetch();  // the full build compiled, stored and loaded
  const CacheCounters after = cache_counters();
  CHECK(after.upgrades == before.upgrades + 1);
  CHECK(after.compiles == before.compiles + 2);  // the quick build and the full one
  const Function full = generated_function(module, "kiln_test_poly", 0);
  CHECK_FALSE(is_quick_build(full));
  CHECK(full.handle != quick.handle);
  const std::optional<Function> stored = function_if_cached(*module[0], generated_dtypes(), 0, 0);
  REQUIRE(stored);
  CHECK(stored->handle == full.handle);
  p.launch_with(full);
  const std::vector<float> from_full = p.read();
  p.check(from_full, "full build, called");
  MESSAGE("quick and full builds give the same bits: " << std::string(from_quick == from_full ? "yes" : "no"));

  g.launch(p.s);  // swaps the node's function before it launches
  CHECK(g.quick_builds() == 0);
  CHECK(p.read() == from_full);  // the replay ran the full build
}

TEST_CASE("quick tier: FullTierOnly gets the full build where only a quick one is loaded, and off compiles it alone") {
  const kiln_test::QuickTierOn on;
  if (quick_tier_options().empty()) return;
  Poly p;
  {
    const auto module = fresh_poly_module();
    HoldPrefetch hold;
    CHECK(is_quick_build(generated_function(module, "kiln_test_poly", 0)));
    const CacheCounters before = cache_counters();
    Function full;
    {
      const FullTierOnly only;
      full = generated_function(module, "kiln_test_poly", 0);
    }
    CHECK_FALSE(is_quick_build(full));
    CHECK(cache_counters().upgrades == before.upgrades + 1);
    CHECK(generated_function(module, "kiln_test_poly", 0).handle == full.handle);  // everyone's now
    p.launch_with(full);
    p.check(p.read(), "full build under FullTierOnly");
    hold.release();
    wait_for_prefetch();  // the queued full build finds it done
    CHECK(cache_counters().upgrades == before.upgrades + 1);
  }
  set_quick_tier(false);
  const auto module = fresh_poly_module();
  const CacheCounters before = cache_counters();
  const Function f = generated_function(module, "kiln_test_poly", 0);
  CHECK_FALSE(is_quick_build(f));
  CHECK(cache_counters().quick_compiles == before.quick_compiles);
  CHECK(cache_counters().compiles == before.compiles + 1);
  p.launch_with(f);
  p.check(p.read(), "quick tier off");
}

TEST_CASE("quick tier: a process that exits right after a first use stores the full build for the next one") {
  const fs::path dir = fs::temp_directory_path() / ("kiln-quick-exit-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto helper = [&](bool no_compile) {
    kiln_test::EnvOverrides env{{"KILN_CACHE_DIR", dir.string()}, {"KILN_QUICK_TIER", "on"}};
    env.emplace_back("KILN_NO_COMPILE", no_compile ? std::optional<std::string>("1") : std::nullopt);
    const kiln_test::ProcessResult r = kiln_test::run_process({KILN_TEST_HELPER_PATH, "load", "add", "f32,f32"}, env);
    INFO("stderr: " << r.err);
    REQUIRE(r.exit_code == 0);
    return nlohmann::json::parse(r.out);
  };
  const nlohmann::json first = helper(false);
  if (quick_tier_options().empty()) return;
  CHECK(first.at("quick_compiles") == 1);  // ran its quick build; the full one finished at exit
  const nlohmann::json second = helper(true);
  CHECK(second.at("compiles") == 0);
  CHECK(second.at("disk_hits") == 1);
  fs::remove_all(dir);
}
