// What a process logs when it compiles, and the switch that forbids compiling.
#include <doctest/doctest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "process.h"

namespace fs = std::filesystem;
using kiln_test::run_process;

namespace {
fs::path fresh_dir(const char* name) {
  fs::path d = fs::temp_directory_path() / (std::string("kiln-log-") + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}
}  // namespace

TEST_CASE("KILN_LOG_LEVEL=debug logs each compile with op, dtypes, arch and ms, plus one info line") {
  fs::path dir = fresh_dir("debug");
  auto r = run_process({KILN_TEST_HELPER_PATH, "warm", "fill", "f32", "sm_90"},
                       {{"KILN_CACHE_DIR", dir.string()}, {"KILN_LOG_LEVEL", "debug"}});
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.find("compiled fill (f32) for sm_90 in") != std::string::npos);
  CHECK(r.err.find(" ms") != std::string::npos);
  CHECK(r.err.find("`jitcc warm`") != std::string::npos);

  auto quiet = run_process({KILN_TEST_HELPER_PATH, "warm", "fill", "f64", "sm_90"},
                           {{"KILN_CACHE_DIR", dir.string()}, {"KILN_LOG_LEVEL", "error"}});
  REQUIRE(quiet.exit_code == 0);
  CHECK(quiet.err.empty());
  fs::remove_all(dir);
}

TEST_CASE("KILN_NO_COMPILE=1 turns a cache miss into an error and leaves hits alone") {
  fs::path dir = fresh_dir("nocompile");
  kiln_test::EnvOverrides env{{"KILN_CACHE_DIR", dir.string()}, {"KILN_NO_COMPILE", "1"}};
  auto miss = run_process({KILN_TEST_HELPER_PATH, "warm", "fill", "i32", "sm_90"}, env);
  CHECK(miss.exit_code != 0);
  CHECK(miss.err.find("KILN_NO_COMPILE") != std::string::npos);

  REQUIRE(run_process({KILN_TEST_HELPER_PATH, "warm", "fill", "i32", "sm_90"}, {{"KILN_CACHE_DIR", dir.string()}})
              .exit_code == 0);
  auto hit = run_process({KILN_TEST_HELPER_PATH, "warm", "fill", "i32", "sm_90"}, env);
  REQUIRE(hit.exit_code == 0);
  auto counters = nlohmann::json::parse(hit.out);
  CHECK(counters.at("compiles") == 0);
  CHECK(counters.at("disk_hits") == 1);
  fs::remove_all(dir);
}
