#pragma once
// Shared by the jitcc tests: run jitcc / kiln_test_helper as child processes on a
// private cache directory, and a small selection of registered kernels to compile.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "kiln/runtime/kernel_registry.h"
#include "kiln/version.h"
#include "process.h"
#include "temp_dir.h"

namespace jitcc_test {

namespace fs = std::filesystem;
using kiln_test::ProcessResult;

using ScratchDir = kiln_test::TempDir;

// Children see a plain rw cache whatever the developer's shell exports.
inline kiln_test::EnvOverrides child_env(const fs::path& cache_dir = {}) {
  kiln_test::EnvOverrides env{{"KILN_CACHE", "rw"},
                              {"KILN_CACHE_MAX_SIZE", std::nullopt},
                              {"KILN_NO_COMPILE", std::nullopt},
                              {"KILN_LOG_LEVEL", "warn"}};
  if (cache_dir.empty())
    env.emplace_back("KILN_CACHE_DIR", std::nullopt);
  else
    env.emplace_back("KILN_CACHE_DIR", cache_dir.string());
  return env;
}

inline std::vector<std::string> jitcc_argv(std::vector<std::string> args) {
  args.insert(args.begin(), KILN_JITCC_PATH);
  return args;
}

// `env` is applied over child_env(), e.g. {{"KILN_CACHE_MAX_SIZE", "1"}}.
inline ProcessResult jitcc(const std::vector<std::string>& args, const kiln_test::EnvOverrides& env = {}) {
  kiln_test::EnvOverrides all = child_env();
  all.insert(all.end(), env.begin(), env.end());
  ProcessResult r = kiln_test::run_process(jitcc_argv(args), all);
  INFO("jitcc stderr: " << r.err);
  REQUIRE(r.exit_code < 128);  // never killed by a signal
  return r;
}

// Runs jitcc with --json and parses stdout, which must hold exactly one object.
inline nlohmann::json jitcc_json(std::vector<std::string> args, int expect_exit = 0) {
  args.push_back("--json");
  ProcessResult r = jitcc(args);
  INFO("jitcc " << args.front() << " stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.exit_code == expect_exit);
  nlohmann::json j = nlohmann::json::parse(r.out);
  REQUIRE(j.is_object());
  return j;
}

struct Instance {
  std::string op, dtypes, entry;
  std::uint32_t variant;
};

// A handful of all-f32 instantiations of up to three ops (so tests compile few kernels),
// chosen from the registry the way `jitcc warm --ops ... --dtypes f32` chooses them.
struct Selection {
  std::string ops;  // for --ops
  std::vector<Instance> instances;
};

inline const Selection& selection() {
  static const Selection sel = [] {
    REQUIRE(kiln::version() != nullptr);  // loads libkiln and its registered kernels
    std::vector<const kiln::rt::KernelSpec*> specs = kiln::rt::registered_kernels();
    std::sort(specs.begin(), specs.end(), [](auto* a, auto* b) { return a->op < b->op; });
    // Prefer one op of each kind the runtime registers first, when present.
    const std::vector<std::string> preferred{"fill", "add", "sum"};
    std::stable_partition(specs.begin(), specs.end(), [&](auto* s) {
      return std::find(preferred.begin(), preferred.end(), s->op) != preferred.end();
    });
    Selection s;
    int ops = 0;
    for (const auto* spec : specs) {
      if (ops == 3) break;
      std::vector<Instance> mine;
      for (const kiln::DTypes& d : spec->dtypes) {
        bool all_f32 = true;
        for (int i = 0; i < d.size(); ++i) all_f32 = all_f32 && d[i] == kiln::DType::f32;
        if (!all_f32) continue;
        for (std::uint32_t v : spec->variants) mine.push_back({spec->op, d.str(), spec->entry, v});
      }
      if (mine.empty() || s.instances.size() + mine.size() > 6) continue;
      s.ops += (s.ops.empty() ? "" : ",") + spec->op;
      s.instances.insert(s.instances.end(), mine.begin(), mine.end());
      ++ops;
    }
    REQUIRE_MESSAGE(s.instances.size() >= 2, "the registry needs at least two f32 kernels for these tests");
    return s;
  }();
  return sel;
}

inline std::vector<std::string> warm_args(const fs::path& cache_dir) {
  return {"warm", "--arch", "sm_90", "--ops", selection().ops, "--dtypes", "f32", "--cache-dir", cache_dir.string()};
}

// A cache holding every selected instance, warmed once per test run; tests copy it.
inline void copy_warmed_cache(const fs::path& to) {
  static ScratchDir seed;
  static bool warmed = [] {
    nlohmann::json j = jitcc_json(warm_args(seed.path()));
    REQUIRE(j.at("failed") == 0);
    REQUIRE(j.at("compiled") == static_cast<std::int64_t>(selection().instances.size()));
    return true;
  }();
  REQUIRE(warmed);
  fs::copy(seed.path(), to, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
}

// The entry files under a cache directory (its shards), not temp or quarantined files.
inline std::vector<fs::path> entry_files(const fs::path& cache_dir) {
  std::vector<fs::path> out;
  for (const auto& shard : fs::directory_iterator(cache_dir)) {
    if (!shard.is_directory() || shard.path().filename() == "quarantine") continue;
    for (const auto& f : fs::directory_iterator(shard.path()))
      if (f.is_regular_file() && f.path().extension() == ".kiln") out.push_back(f.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

inline std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace jitcc_test
