// Compile servers run below their thread's priority unless the process asks otherwise
// (rt::set_compile_servers_lowered): jitcc's compiles are its work, a run's are not.
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "kiln/runtime/compiler.h"
#include "nvrtc_run.h"

namespace rt = kiln::rt;

namespace {

// Niceness of each kiln-nvrtc-server this process started and still runs, by pid.
std::map<int, int> server_niceness() {
  std::map<int, int> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::size_t open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    if (stat.substr(open + 1, close - open - 1).rfind("kiln-nvrtc", 0) != 0) continue;
    // After the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime
    // stime cutime cstime priority nice ...
    std::istringstream rest(stat.substr(close + 2));
    std::string field;
    int ppid = 0, nice = 0;
    for (int i = 1; i <= 17 && rest >> field; ++i) {
      if (i == 2) ppid = std::stoi(field);
      if (i == 17) nice = std::stoi(field);
    }
    if (ppid == ::getpid()) out[std::stoi(name)] = nice;
  }
  return out;
}

// Compiles on a new thread (so a new server starts) and gives that server's niceness minus the
// thread's own; nullopt when no new server ran the compile.
std::optional<int> new_server_offset() {
  std::optional<int> offset;
  std::thread t([&] {
    const std::map<int, int> before = server_niceness();
    rt::compile({"priority_probe", "f32", "extern \"C\" __global__ void k(float* x) { x[0] = 1.f; }\n", 90});
    for (const auto& [pid, nice] : server_niceness())
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
