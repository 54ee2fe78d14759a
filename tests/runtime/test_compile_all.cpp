// Every registered kernel x dtype tuple x variant compiles with NVRTC for sm_80 and
// sm_90. No GPU needed; compiles run on every hardware thread.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/launchers.h"
#include "kiln/error.h"
#include "kiln/runtime/compiler.h"
#include "kiln/runtime/kernel_registry.h"

using namespace kiln;

namespace {

struct Job {
  const rt::KernelSpec* spec;
  DTypes dtypes;
  std::uint32_t variant;
  int arch;
};

std::string job_name(const Job& j) {
  return j.spec->op + "(dtypes=" + j.dtypes.str() + ", variant=" + std::to_string(j.variant) + ", sm_" +
         std::to_string(j.arch) + ")";
}

// The CompileError text holds the whole numbered source; the log part is what helps.
std::string shorten(const std::string& what) {
  auto cut = what.find("\n--- source ---");
  return cut == std::string::npos ? what.substr(0, 4000) : what.substr(0, std::min<std::size_t>(cut, 4000));
}

std::size_t count_entries(const std::string& ptx) {
  std::size_t n = 0;
  for (std::size_t at = ptx.find(".entry "); at != std::string::npos; at = ptx.find(".entry ", at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("every registered kernel compiles for sm_80 and sm_90") {
  // Referencing libkiln keeps it linked, so its static initialisers register the specs.
  REQUIRE(kernels::kernel("add").op == "add");

  std::vector<Job> jobs;
  for (const rt::KernelSpec* spec : rt::registered_kernels())
    for (const DTypes& d : spec->dtypes)
      for (std::uint32_t v : spec->variants)
        for (int arch : {80, 90}) jobs.push_back({spec, d, v, arch});
  // Hundreds of instantiations per arch, not thousands: the warm cache and CI pay for each.
  CHECK(jobs.size() / 2 <= 1500);

  std::atomic<std::size_t> next{0};
  std::mutex mu;
  std::vector<std::string> failures;
  std::vector<double> ms;
  auto worker = [&] {
    for (std::size_t i = next++; i < jobs.size(); i = next++) {
      const Job& j = jobs[i];
      try {
        rt::CompileRequest req{j.spec->op, j.dtypes.str(), rt::instantiate_kernel(*j.spec, j.dtypes, j.variant), j.arch};
        rt::CompiledModule m = rt::compile(req);
        std::string problem;
        if (m.ptx.find(j.spec->entry) == std::string::npos) problem = "PTX lacks entry point " + j.spec->entry;
        // A template that guards its kernels by entry gives each op a module of one kernel.
        if (rt::template_source(j.spec->template_name).find("KILN_ENTRY_") != std::string::npos &&
            count_entries(m.ptx) != 1)
          problem = "a guarded template's module holds " + std::to_string(count_entries(m.ptx)) + " entry points";
        if (rt::nvrtc_can_emit_cubin(j.arch) && m.cubin.empty()) problem = "no CUBIN";
        std::lock_guard lock(mu);
        if (!problem.empty()) failures.push_back(job_name(j) + ": " + problem);
        ms.push_back(m.ms);
      } catch (const std::exception& e) {
        std::lock_guard lock(mu);
        failures.push_back(job_name(j) + ": " + shorten(e.what()));
      }
    }
  };

  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::sort(ms.begin(), ms.end());
  std::printf("compiled %zu of %zu instantiations (%zu kernel specs, sm_80 + sm_90) in %.1f s on %u threads; "
              "median NVRTC %.0f ms\n",
              ms.size(), jobs.size(), rt::registered_kernels().size(), seconds, threads,
              ms.empty() ? 0.0 : ms[ms.size() / 2]);
  for (std::size_t i = 0; i < failures.size() && i < 10; ++i) MESSAGE(failures[i]);
  CHECK_MESSAGE(failures.empty(), failures.size(), " instantiations failed");
}

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
