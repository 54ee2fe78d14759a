#pragma once
// What the source tests of the GEMM family's plain-product kinds (mma.sync, FFMA) share: a
// packed problem, a compile job per planned launch, and the checks every compiled module of a
// kind must pass. Runs without a GPU.
#include <doctest/doctest.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda/generated/gemm/gemm_plan.h"
#include "compile_check.h"
#include "kiln/runtime/templates.h"

namespace kiln_test {

// m x n x k with A and B K-major (or MN-major), packed.
inline kiln::kernels::GemmGeometry packed_product(std::int64_t m, std::int64_t n, std::int64_t k,
                                                  kiln::kernels::GemmMath math, bool a_mn = false, bool b_mn = false,
                                                  kiln::kernels::GemmEpilogue e = kiln::kernels::GemmEpilogue::none) {
  kiln::kernels::GemmGeometry g{m, n, k, a_mn ? m : k, b_mn ? n : k, n, math, e};
  g.a_mn = a_mn, g.b_mn = b_mn;
  return g;
}

// The module of launch `l`, which kind `kind` must have planned, as a compile job for `arch`.
inline void add_launch_job(std::vector<CompileJob>& jobs, const std::optional<kiln::kernels::GemmLaunch>& l,
                           kiln::kernels::GemmKernel kind, int arch) {
  REQUIRE(l);
  CHECK(l->kernel == kind);
  const std::string src = kiln::kernels::source(*l);
  CHECK(kiln::rt::template_placeholders(src).empty());
  const std::string entry = std::string("kiln_gemm_") + kiln::kernels::kernel_name(kind);
  jobs.push_back(generated_job("check_gemm_plain", src, entry, arch));
}

// Compiles the jobs; each must compile, its PTX hold the kind's entry and every needle, and keep
// nothing in local memory (the sums stay in registers).
inline void check_launch_jobs(const std::vector<CompileJob>& jobs, kiln::kernels::GemmKernel kind,
                              std::initializer_list<const char*> needles) {
  const CompileSummary r = compile_all(jobs);
  const std::string entry = std::string("kiln_gemm_") + kiln::kernels::kernel_name(kind);
  MESSAGE(entry << ": " << r.text());
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    CAPTURE(i);
    const CompileOutcome& o = r.outcomes[i];
    CHECK_MESSAGE(o.error.empty(), o.error);
    CHECK(o.cubin.size() > 0);
    CHECK(o.ptx.find(entry) != std::string::npos);
    for (const char* needle : needles) CHECK(o.ptx.find(needle) != std::string::npos);
    CHECK(o.ptx.find("__local_depot") == std::string::npos);
  }
}

}  // namespace kiln_test
