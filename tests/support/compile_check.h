#pragma once
// NVRTC compile checks of many kernels at once, without a GPU: the jobs spread over
// rt::compile_jobs() threads (each with its compile server) and go through the disk cache of the test
// run (ctest sets KILN_CACHE_DIR), so a kernel that an earlier suite, job or run compiled is
// read back instead of compiled again. A hit is that compile's own output: the cache key
// hashes the source, every NVRTC option, NVRTC's version and the arch.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kiln/runtime/compile_jobs.h"
#include "kiln/runtime/disk_cache.h"
#include "kiln/runtime/generated_kernels.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/module_cache.h"

namespace kiln_test {

struct CompileJob {
  const kiln::rt::KernelSpec* spec = nullptr;
  kiln::DTypes dtypes{};
  std::uint32_t variant = 0;
  int arch = 90;
};

// A job for a source made outside the registry (a generated family's): registered as a
// generated module of `kind` (a static string of letters, digits and '_'), so its entry is
// named like the runtime's generated kernels, apart from them.
inline CompileJob generated_job(std::string_view kind, const std::string& source, const std::string& entry, int arch) {
  kiln::rt::GeneratedKey key(kind);
  key.add(kiln::rt::fnv1a64(source), kiln::rt::fnv1a64(entry));
  const kiln::rt::KernelSpec* spec = kiln::rt::generated_kernels(key, [&] {
    return kiln::rt::GeneratedModule{source, std::string(kind), {entry}};
  })[0];
  return {spec, spec->dtypes.front(), 0, arch};
}

struct CompileOutcome {
  std::string ptx, cubin;  // empty when the compile failed
  std::string function{};  // its entry point in a bundle's binaries (kernel_bundle.h); "" compiled alone
  std::string error{};     // the first 4000 characters of what failed, NVRTC's log first
  bool compiled = false;   // false: read back from the cache
  double seconds = 0;      // this job's wall time on its thread (NVRTC and ptxas when compiled)
};

struct CompileSummary {
  std::vector<CompileOutcome> outcomes;  // in job order
  std::size_t compiled = 0, cached = 0, failed = 0;
  double seconds = 0;
  unsigned threads = 1;
  // The median time of one compiled kernel (0 when none compiled): what a first run waits per kernel.
  double median_compile_seconds() const {
    std::vector<double> t;
    for (const CompileOutcome& o : outcomes)
      if (o.compiled) t.push_back(o.seconds);
    if (t.empty()) return 0;
    std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
    return t[t.size() / 2];
  }
  // "40 kernels: 3 compiled (median 0.21 s each), 37 from the cache, 0 failed, in 1.2 s on 2 threads"
  std::string text() const {
    char b[200];
    std::snprintf(b, sizeof b,
                  "%zu kernels: %zu compiled (median %.2f s each), %zu from the cache, %zu failed, in %.1f s on %u threads",
                  outcomes.size(), compiled, median_compile_seconds(), cached, failed, seconds, threads);
    return b;
  }
};

inline CompileSummary compile_all(const std::vector<CompileJob>& jobs) {
  CompileSummary r;
  r.outcomes.resize(jobs.size());
  r.threads = std::max(1u, std::min<unsigned>(static_cast<unsigned>(kiln::rt::compile_jobs()), static_cast<unsigned>(jobs.size())));
  std::atomic<std::size_t> next{0}, compiled{0}, failed{0};
  auto worker = [&] {
    for (std::size_t i = next++; i < jobs.size(); i = next++) {
      const CompileJob& j = jobs[i];
      CompileOutcome& o = r.outcomes[i];
      const auto job_start = std::chrono::steady_clock::now();
      try {
        kiln::rt::WarmOutcome how{};
        kiln::rt::Entry e = kiln::rt::cached_entry(*j.spec, j.dtypes, j.variant, j.arch, &how);
        o.ptx = std::move(e.ptx);
        o.cubin = std::move(e.cubin);
        o.function = std::move(e.key.function);
        o.compiled = how == kiln::rt::WarmOutcome::compiled;
        if (o.compiled) ++compiled;
      } catch (const std::exception& e) {
        // A CompileError's text holds the whole numbered source after the log.
        const std::string what = e.what();
        o.error = what.substr(0, std::min<std::size_t>(what.find("\n--- source ---"), 4000));
        ++failed;
      }
      o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - job_start).count();
    }
  };
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < r.threads; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.compiled = compiled;
  r.failed = failed;
  r.cached = jobs.size() - r.compiled - r.failed;
  return r;
}

// Whether sm_90 PTX states that its kernels wait for prior grids (the prelude's
// KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS, which lets the runtime launch them before the kernel ahead
// of them has finished) and every kernel in it does, before any instruction that reads or writes memory
// other than its parameters and its thread's or block's own.
inline bool every_kernel_waits_for_prior_grids(const std::string& ptx) {
  if (ptx.find(" kiln_kernels_wait_for_prior_grids") == std::string::npos) return false;
  std::size_t at = ptx.find(".entry ");
  if (at == std::string::npos) return false;
  for (; at != std::string::npos; at = ptx.find(".entry ", at + 1)) {
    const std::size_t body = ptx.find('{', at), wait = ptx.find("griddepcontrol.wait", at);
    if (body == std::string::npos || wait == std::string::npos || wait > ptx.find(".entry ", at + 1)) return false;
    std::size_t line = body + 1;
    while (line < wait) {
      std::size_t end = std::min(ptx.find('\n', line), wait);
      std::string_view l(ptx.data() + line, end - line);
      l.remove_prefix(std::min(l.find_first_not_of(" \t"), l.size()));
      if (!l.empty() && l[0] == '@') l.remove_prefix(std::min(l.find_first_of(" \t") + 1, l.size()));
      // Parameters, and thread- or block-private memory, may come first.
      const bool own = (l.substr(0, 3) == "ld." || l.substr(0, 3) == "st.") &&
                       (l.substr(3, 5) == "param" || l.substr(3, 5) == "local" || l.substr(3, 6) == "shared");
      for (std::string_view op : {"ld.", "st.", "atom.", "red.", "cp.", "tex.", "suld", "sust", "prefetch", "mbarrier",
                                  "wgmma", "multimem", "tensormap"})
        if (!own && l.substr(0, op.size()) == op) return false;
      line = end + 1;
    }
  }
  return true;
}

}  // namespace kiln_test
