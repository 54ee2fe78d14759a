// Compile servers run below their thread's priority unless the process asks otherwise
// (rt::set_compile_servers_lowered): jitcc's compiles are its work, a run's are not.
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "compile_servers.h"
#include "kiln/runtime/compiler.h"
#include "nvrtc_run.h"

namespace rt = kiln::rt;

namespace {

// Compiles on a new thread (so a new server starts) and gives that server's niceness minus the
// thread's own; nullopt when no new server ran the compile.
std::optional<int> new_server_offset() {
  std::optional<int> offset;
  std::thread t([&] {
    const std::map<int, int> before = kiln_test::own_compile_servers();
    rt::compile({"priority_probe", "f32", "extern \"C\" __global__ void k(float* x) { x[0] = 1.f; }\n", 90});
    for (const auto& [pid, nice] : kiln_test::own_compile_servers())
      if (!before.contains(pid)) offset = nice - ::getpriority(PRIO_PROCESS, 0);
  });
  t.join();
  return offset;
}

}  // namespace

TEST_CASE("compile servers run 5 below their thread's priority unless turned off, as jitcc does") {
  const char* in_process = std::getenv("KILN_COMPILE_IN_PROCESS");
  if (!rt::nvrtc_server_path() || (in_process && *in_process && std::string(in_process) != "0")) {
    MESSAGE("no compile server runs here: nothing to check");
    return;
  }
  REQUIRE(rt::compile_servers_lowered());  // the default: a run's threads keep their cores
  const std::optional<int> lowered = new_server_offset();
  rt::set_compile_servers_lowered(false);
  const std::optional<int> level = new_server_offset();
  rt::set_compile_servers_lowered(true);
  REQUIRE(lowered.has_value());
  REQUIRE(level.has_value());
  if (::getpriority(PRIO_PROCESS, 0) + 5 <= 19) CHECK(*lowered == 5);
  CHECK(*level == 0);
}
