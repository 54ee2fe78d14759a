// Compile servers see one GPU, or none with NVRTC's cache off: the driver that NVRTC's cache
// initialises in each of them opens every GPU it is shown (server_environment.h says what it cost).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "compile_servers.h"
#include "kiln/runtime/compiler.h"
#include "nvrtc_run.h"
#include "scoped_env.h"
#include "server_environment.h"

namespace rt = kiln::rt;

namespace {

std::vector<std::string> server_env(std::vector<const char*> parent) {
  parent.push_back(nullptr);
  return rt::compile_server_environment(parent.data());
}

std::vector<std::string> visible_entries(const std::vector<std::string>& env) {
  std::vector<std::string> out;
  for (const std::string& e : env)
    if (e.starts_with("CUDA_VISIBLE_DEVICES=")) out.push_back(e);
  return out;
}

}  // namespace

TEST_CASE("a compile server is shown the first of its process's GPUs, and the rest of the environment as it is") {
  CHECK(server_env({"PATH=/bin", "CUDA_VISIBLE_DEVICES=3,1", "HOME=/root"}) ==
        std::vector<std::string>{"PATH=/bin", "HOME=/root", "CUDA_VISIBLE_DEVICES=3"});
  CHECK(visible_entries(server_env({"CUDA_VISIBLE_DEVICES=GPU-5e1c,GPU-77aa"})) ==
        std::vector<std::string>{"CUDA_VISIBLE_DEVICES=GPU-5e1c"});
  CHECK(visible_entries(server_env({"CUDA_VISIBLE_DEVICES=2"})) == std::vector<std::string>{"CUDA_VISIBLE_DEVICES=2"});
  SUBCASE("none set: the first device") {
    CHECK(server_env({"PATH=/bin"}) == std::vector<std::string>{"PATH=/bin", "CUDA_VISIBLE_DEVICES=0"});
    CHECK(server_env({}) == std::vector<std::string>{"CUDA_VISIBLE_DEVICES=0"});
  }
  SUBCASE("an empty list stays empty") {
    CHECK(visible_entries(server_env({"CUDA_VISIBLE_DEVICES="})) == std::vector<std::string>{"CUDA_VISIBLE_DEVICES="});
  }
}

TEST_CASE("with NVRTC's cache off a compile server is shown no GPU") {
  CHECK(server_env({"CUDA_CACHE_DISABLE=1", "CUDA_VISIBLE_DEVICES=1,2"}) ==
        std::vector<std::string>{"CUDA_CACHE_DISABLE=1", "CUDA_VISIBLE_DEVICES="});
  CHECK(visible_entries(server_env({"CUDA_CACHE_DISABLE=1"})) == std::vector<std::string>{"CUDA_VISIBLE_DEVICES="});
  // The driver turns its cache off only for 1.
  CHECK(visible_entries(server_env({"CUDA_CACHE_DISABLE=0", "CUDA_VISIBLE_DEVICES=1,2"})) ==
        std::vector<std::string>{"CUDA_VISIBLE_DEVICES=1"});
}

TEST_CASE("a started compile server runs with that environment") {
  const char* in_process = std::getenv("KILN_COMPILE_IN_PROCESS");
  if (!rt::nvrtc_server_path() || (in_process && *in_process && std::string(in_process) != "0")) {
    MESSAGE("no compile server runs here: nothing to check");
    return;
  }
  struct Case {
    const char* cache_disable;
    const char* expected;
  };
  for (const Case& c : {Case{"0", "CUDA_VISIBLE_DEVICES=7"}, Case{"1", "CUDA_VISIBLE_DEVICES="}}) {
    const std::string cache_disable = c.cache_disable, expected = c.expected;
    CAPTURE(cache_disable);
    kiln_test::ScopedEnv env({{"CUDA_VISIBLE_DEVICES", "7,6"}, {"CUDA_CACHE_DISABLE", cache_disable}});
    std::optional<std::vector<std::string>> seen;
    std::thread t([&] {  // a new thread, so a new server
      const std::map<int, int> before = kiln_test::own_compile_servers();
      rt::compile({"environment_probe", "f32", "extern \"C\" __global__ void k(float* x) { x[0] = 2.f; }\n", 90});
      for (const auto& [pid, nice] : kiln_test::own_compile_servers())
        if (!before.contains(pid)) seen = visible_entries(kiln_test::process_environment(pid));
    });
    t.join();
    REQUIRE(seen.has_value());
    CHECK(*seen == std::vector<std::string>{expected});
  }
}
