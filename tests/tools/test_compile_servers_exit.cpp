// A run killed while it compiles leaves no compile server (kiln-nvrtc-server) behind: each
// server ends when its parent's end of the socket closes. A tool dying of a fatal signal says
// where (kiln_cli's trace_fatal_signals). No GPU (jitcc warm --arch).
#include <doctest/doctest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "jitcc_test_util.h"

namespace {

// The process's state letter and parent, from /proc/PID/stat; state 0 when it is gone.
struct ProcState {
  char state = 0;
  pid_t parent = 0;
  std::string name;
};

ProcState proc_state(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const std::size_t open = text.find('('), close = text.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close + 4 >= text.size()) return {};
  ProcState s;
  s.name = text.substr(open + 1, close - open - 1);
  s.state = text[close + 2];
  s.parent = static_cast<pid_t>(std::stol(text.substr(close + 4)));
  return s;
}

// The running compile servers whose parent is `parent`.
std::vector<pid_t> servers_of(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string n = e.path().filename().string();
    if (n.find_first_not_of("0123456789") != std::string::npos) continue;
    const ProcState s = proc_state(static_cast<pid_t>(std::stol(n)));
    // /proc truncates the name to 15 characters.
    if (s.parent == parent && s.name.rfind("kiln-nvrtc-ser", 0) == 0 && s.state != 'Z') out.push_back(std::stol(n));
  }
  return out;
}

bool running(pid_t pid) {
  const ProcState s = proc_state(pid);
  return s.state != 0 && s.state != 'Z' && s.name.rfind("kiln-nvrtc-ser", 0) == 0;
}

// The compile servers of `parent` once `count` run (fewer after a minute).
std::vector<pid_t> wait_for_servers(pid_t parent, std::size_t count) {
  std::vector<pid_t> servers;
  const auto start = std::chrono::steady_clock::now();
  while (servers.size() < count && std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    servers = servers_of(parent);
  }
  return servers;
}

// Whether `servers` all end within 20 s of their parent's end: a compile under way finishes
// first (well under a second here), then each sees its socket closed. Any left are killed, so the
// test leaves none behind either.
bool servers_end(std::vector<pid_t> servers) {
  const auto killed = std::chrono::steady_clock::now();
  while (!servers.empty() && std::chrono::steady_clock::now() - killed < std::chrono::seconds(20)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::erase_if(servers, [](pid_t p) { return !running(p); });
  }
  for (pid_t p : servers) ::kill(p, SIGKILL);
  return servers.empty();
}

// A child's environment with its cache in `dir`, compiling in servers.
kiln_test::EnvOverrides server_env(const ScratchDir& dir) {
  kiln_test::EnvOverrides env = child_env(dir.path());
  env.emplace_back("KILN_COMPILE_IN_PROCESS", std::nullopt);
  return env;
}

// A full jitcc warm on `jobs` compile servers, once they run.
struct WarmOnServers {
  ScratchDir dir;
  kiln_test::Process warm;
  std::vector<pid_t> servers;
  explicit WarmOnServers(std::size_t jobs)
      : warm(jitcc_argv({"warm", "--arch", "sm_90", "--jobs", std::to_string(jobs)}), server_env(dir)),
        servers(wait_for_servers(warm.pid(), jobs)) {}
};

}  // namespace

TEST_CASE("a jitcc warm killed while compiling leaves no compile server running") {
  WarmOnServers w(2);
  REQUIRE(w.servers.size() == 2);  // one per compiling thread
  ::kill(w.warm.pid(), SIGKILL);
  CHECK(w.warm.wait().exit_code == 128 + SIGKILL);
  CHECK(servers_end(w.servers));
}

TEST_CASE("a process that exits while a prefetch thread compiles does not wait for it, and leaves no server") {
  ScratchDir dir;
  const kiln_test::ProcessResult r =
      kiln_test::run_process({KILN_TEST_HELPER_PATH, "prefetch-exit", "sm_90"}, server_env(dir));
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.out.find("exiting") != std::string::npos);
  std::vector<pid_t> servers;
  for (std::size_t at = r.out.find("server "); at != std::string::npos; at = r.out.find("server ", at + 1))
    servers.push_back(static_cast<pid_t>(std::stol(r.out.substr(at + 7))));
  REQUIRE(servers.size() == 1);
  CHECK_FALSE(running(servers[0]));  // killed at the exit and reaped, not left compiling
  // Seconds of compiling were stopped, not waited for: nothing was stored.
  for (const auto& e : fs::recursive_directory_iterator(dir.path())) {
    if (!e.is_regular_file()) continue;
    std::ifstream f(e.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    CAPTURE(e.path().string());
    CHECK(bytes.find("prefetch_exit_") == std::string::npos);
  }
  CHECK(r.err.find("compile servers failed") == std::string::npos);  // no false alarm
}

TEST_CASE("jitcc dying of a fatal signal writes the signal, its thread and a backtrace, then dies of it") {
  WarmOnServers w(1);  // a compile server running: main() has long installed the handler
  REQUIRE(w.servers.size() == 1);
  ::kill(w.warm.pid(), SIGSEGV);
  const kiln_test::ProcessResult r = w.warm.wait();
  CHECK(r.exit_code == 128 + SIGSEGV);
  INFO(r.err);
  const std::size_t at = r.err.find("jitcc: fatal signal 11 (Segmentation fault) in thread ");
  REQUIRE(at != std::string::npos);
  const std::size_t trace = r.err.find("; backtrace:\n", at);
  REQUIRE(trace != std::string::npos);
  // backtrace_symbols_fd's lines: the module, then the frame's offset or symbol.
  CHECK(r.err.find("jitcc(", trace) != std::string::npos);
  CHECK(servers_end(w.servers));
}
