// Every registered kernel x dtype tuple x variant compiles with NVRTC for sm_80 and for sm_90
// (a test case each, so ctest runs them side by side). No GPU needed. Compiles go through the
// test run's disk cache (compile_check.h): each kernel compiles once per run of the test
// command, and a later run or job reads back what an earlier one compiled.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "backend/cuda/launch_common.h"
#include "compile_check.h"
#include "kiln/error.h"
#include "kiln/runtime/compiler.h"
#include "kiln/runtime/kernel_bundle.h"
#include "kiln/runtime/kernel_registry.h"

using namespace kiln;

namespace {

// The entry points of the PTX; for a kernel of a bundle (`function` its renamed entry point),
// those of its own part of the bundle: the ones renamed with its index.
std::size_t count_entries(const std::string& ptx, const std::string& function) {
  const std::string_view own = rt::entry_name_of(function);
  const std::string suffix = function.substr(own.size());
  std::size_t n = 0;
  for (std::size_t at = ptx.find(".entry "); at != std::string::npos; at = ptx.find(".entry ", at + 1)) {
    const std::size_t end = ptx.find('(', at);
    n += end != std::string::npos && std::string_view(ptx).substr(at, end - at).ends_with(suffix);
  }
  return n;
}

void check_every_kernel_compiles(int arch) {
  // Referencing libkiln keeps it linked, so its static initialisers register the specs.
  REQUIRE(kernels::kernel("add").op == "add");

  std::vector<kiln_test::CompileJob> jobs;
  for (const rt::KernelSpec* spec : rt::registered_kernels())
    for (const DTypes& d : spec->dtypes)
      for (std::uint32_t v : spec->variants) jobs.push_back({spec, d, v, arch});
  // Hundreds of instantiations per arch, not thousands: the warm cache and CI pay for each.
  CHECK(jobs.size() <= 1500);

  const kiln_test::CompileSummary r = kiln_test::compile_all(jobs);
  MESSAGE("sm_" << arch << ", " << rt::registered_kernels().size() << " kernel specs: " << r.text());
  std::vector<std::string> failures;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const rt::KernelSpec& spec = *jobs[i].spec;
    const kiln_test::CompileOutcome& o = r.outcomes[i];
    std::string problem = o.error;
    const std::string entry = o.function.empty() ? spec.entry : o.function;
    if (problem.empty() && o.ptx.find(entry) == std::string::npos) problem = "PTX lacks entry point " + entry;
    // A template that guards its kernels by entry gives each op a module of one kernel (in a
    // bundle, which a cache warmed by jitcc warm holds, one kernel of its own).
    if (problem.empty() && rt::template_source(spec.template_name).find("KILN_ENTRY_") != std::string::npos &&
        count_entries(o.ptx, o.function) != 1)
      problem =
          "a guarded template's module holds " + std::to_string(count_entries(o.ptx, o.function)) + " entry points";
    if (problem.empty() && rt::nvrtc_can_emit_cubin(arch) && o.cubin.empty()) problem = "no CUBIN";
    // The runtime launches them before the kernel ahead of them drains (rt::launch_raw).
    if (problem.empty() && arch >= 90 && !kiln_test::every_kernel_waits_for_prior_grids(o.ptx))
      problem = "a kernel does not wait for prior grids first";
    if (!problem.empty())
      failures.push_back(spec.op + "(dtypes=" + jobs[i].dtypes.str() + ", variant=" + std::to_string(jobs[i].variant) +
                         ", sm_" + std::to_string(arch) + "): " + problem);
  }
  for (std::size_t i = 0; i < failures.size() && i < 10; ++i) MESSAGE(failures[i]);
  CHECK_MESSAGE(failures.empty(), failures.size(), " instantiations failed");
}

}  // namespace

TEST_CASE("every registered kernel compiles for sm_80") { check_every_kernel_compiles(80); }

TEST_CASE("every registered kernel compiles for sm_90") { check_every_kernel_compiles(90); }

TEST_CASE("the elementwise kernels cover the ops and dtypes the engine needs") {
  const char* ops[] = {"neg",        "abs",    "sign", "exp",      "log",   "log1p", "expm1",   "sqrt",
                       "rsqrt",      "square", "sin",  "cos",      "tanh",  "erf",   "sigmoid", "relu",
                       "leaky_relu", "gelu",   "silu", "softplus", "floor", "ceil",  "round",   "logical_not",
                       "isnan",      "clamp",  "add",  "sub",      "mul",   "div",   "pow",     "maximum",
                       "minimum",    "eq",     "ne",   "lt",       "le",    "gt",    "ge",      "logical_and",
                       "logical_or", "cast",   "fill", "where"};
  for (const char* op : ops) {
    CAPTURE(op);
    const rt::KernelSpec* spec = rt::find_kernel(op);
    REQUIRE(spec != nullptr);
    CHECK(spec->dtypes.size() >= 4);
    CHECK(spec == &kernels::kernel(op));
  }
  auto has = [](const char* op, DTypes d) {
    const auto& v = kernels::kernel(op).dtypes;
    return std::find(v.begin(), v.end(), d) != v.end();
  };
  CHECK(kernels::kernel("cast").dtypes.size() == 64);
  CHECK(has("cast", {DType::bf16, DType::u8}));
  CHECK(has("add", {DType::f16, DType::f16}));
  CHECK(has("add", {DType::u8, DType::u8}));
  CHECK_FALSE(has("add", {DType::boolean, DType::boolean}));
  CHECK_FALSE(has("div", {DType::i32, DType::i32}));  // the engine promotes integer division
  CHECK(has("eq", {DType::boolean, DType::boolean}));
  CHECK(has("isnan", {DType::bf16, DType::boolean}));
  CHECK_FALSE(has("exp", {DType::i64, DType::i64}));
  CHECK(has("fill", {DType::i64}));
  CHECK(has("where", {DType::boolean}));
  CHECK(kernels::kernel("mul").variants == std::vector<std::uint32_t>{0, 1, 2});
  CHECK_THROWS_AS(kernels::kernel("no_such_op"), ValueError);
}
