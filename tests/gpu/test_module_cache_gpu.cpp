// The module cache on a GPU: memory hits, a warm disk cache that loads CUBIN with
// zero NVRTC calls, concurrent first use compiling once, the PTX fallback, and the recompile
// of an entry the driver rejects altogether.
#include <doctest/doctest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "kiln/runtime/device.h"
#include "kiln/runtime/disk_cache.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/version.h"
#include "process.h"

namespace fs = std::filesystem;
namespace rt = kiln::rt;
using kiln_test::run_process;

namespace {
fs::path fresh_dir(const char* name) {
  fs::path d = fs::temp_directory_path() / (std::string("kiln-mc-") + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

nlohmann::json helper(const std::vector<std::string>& args, const fs::path& dir, bool no_compile = false) {
  std::vector<std::string> argv{KILN_TEST_HELPER_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  kiln_test::EnvOverrides env{{"KILN_CACHE_DIR", dir.string()}};
  // Set or removed explicitly: this suite itself may run under KILN_NO_COMPILE=1.
  env.emplace_back("KILN_NO_COMPILE", no_compile ? std::optional<std::string>("1") : std::nullopt);
  auto r = run_process(argv, env);
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  return nlohmann::json::parse(r.out);
}
}  // namespace

TEST_CASE("a second get_function of one key is a memory hit") {
  REQUIRE(kiln::version());
  const rt::KernelSpec* spec = rt::find_kernel("add");
  REQUIRE(spec);
  kiln::DTypes d{kiln::DType::f32, kiln::DType::f32};
  rt::Function a = rt::get_function(*spec, d, 0, 0);
  rt::CacheCounters before = rt::cache_counters();
  rt::Function b = rt::get_function(*spec, d, 0, 0);
  rt::CacheCounters after = rt::cache_counters();
  CHECK(a.handle == b.handle);
  CHECK(after.memory_hits == before.memory_hits + 1);
  CHECK(after.compiles == before.compiles);
  CHECK(after.disk_hits == before.disk_hits);
}

TEST_CASE("a warm cache loads CUBIN and calls NVRTC zero times") {
  fs::path dir = fresh_dir("warm");
  auto cold = helper({"load", "add", "f32,f32"}, dir);
  CHECK(cold.at("compiles") == 1);
  CHECK(cold.at("cubin_loads") == 1);
  auto warm = helper({"load", "add", "f32,f32"}, dir, /*no_compile=*/true);
  CHECK(warm.at("compiles") == 0);
  CHECK(warm.at("disk_hits") == 1);
  CHECK(warm.at("cubin_loads") == 1);
  CHECK(warm.at("ptx_loads") == 0);
  fs::remove_all(dir);
}

TEST_CASE("16 threads asking for one uncached kernel at once compile it once") {
  fs::path dir = fresh_dir("threads");
  auto r = helper({"load-threads", "mul", "f32,f32", "16"}, dir);
  CHECK(r.at("outcome") == "same");
  CHECK(r.at("compiles") == 1);
  fs::remove_all(dir);
}

namespace {

// Warms sub f32 into `dir`, then stores its entry again with a CUBIN the driver rejects and, with
// `reject_ptx`, a PTX it rejects too: valid checksums, so only the driver objects.
void store_rejected_sub(const fs::path& dir, bool reject_ptx) {
  helper({"warm", "sub", "f32,f32", "sm_" + std::to_string(rt::device_info(0).arch())}, dir);
  rt::DiskCache cache(dir, rt::CacheMode::read_write, 0);
  auto entries = cache.list();
  REQUIRE(entries.size() == 1);
  auto entry = cache.read(entries[0].path);
  REQUIRE(entry);
  entry->cubin = "this is not an ELF image";
  if (reject_ptx) entry->ptx = "this is not PTX";
  cache.store(*entry);
}

}  // namespace

TEST_CASE("a CUBIN the driver rejects falls back to the entry's PTX") {
  fs::path dir = fresh_dir("fallback");
  store_rejected_sub(dir, /*reject_ptx=*/false);
  auto r = helper({"load", "sub", "f32,f32"}, dir, /*no_compile=*/true);
  CHECK(r.at("compiles") == 0);
  CHECK(r.at("cubin_loads") == 0);
  CHECK(r.at("ptx_loads") == 1);
  fs::remove_all(dir);
}

TEST_CASE("a cached entry whose CUBIN and PTX the driver both reject is compiled again and replaced") {
  fs::path dir = fresh_dir("rejected");
  store_rejected_sub(dir, /*reject_ptx=*/true);
  auto r = helper({"load", "sub", "f32,f32"}, dir);
  CHECK(r.at("outcome") == "loaded");
  CHECK(r.at("compiles") == 1);
  // The recompile went into the cache: the next process loads its CUBIN and compiles nothing.
  auto again = helper({"load", "sub", "f32,f32"}, dir, /*no_compile=*/true);
  CHECK(again.at("compiles") == 0);
  CHECK(again.at("cubin_loads") == 1);
  fs::remove_all(dir);
}

TEST_CASE("kernels compiled in one bundle load from one module and compute as the CPU does") {
  fs::path dir = fresh_dir("bundle");
  const std::string arch = std::to_string(rt::device_info(0).arch());
  auto warm = helper({"warm-bundle", "abs,neg,exp", "f32,f32", arch}, dir);
  CHECK(warm.at("outcome") == "compiled");
  CHECK(warm.at("compiles") == 1);  // six kernels, one program
  auto run = helper({"unary-check", "abs,neg,exp"}, dir, /*no_compile=*/true);
  CHECK(run.at("outcome") == "same");
  CHECK(run.at("compiles") == 0);
  CHECK(run.at("disk_hits") == 3);
  CHECK(run.at("cubin_loads") == 1);  // the three share the bundle's module
  fs::remove_all(dir);
}
