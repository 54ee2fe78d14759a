#pragma once
// What the kiln-run tests share: running it, scripts for its ranks, waiting on files the ranks
// write, whether a process is still alive, and a pair of free ports for two launchers.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dist/tcp/tcp.h"
#include "process.h"
#include "temp_dir.h"

namespace kiln_run_test {

using Clock = std::chrono::steady_clock;

inline kiln_test::ProcessResult kiln_run(std::vector<std::string> args, const kiln_test::EnvOverrides& env = {}) {
  args.insert(args.begin(), KILN_RUN_PATH);
  return kiln_test::run_process(args, env);
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

inline std::string write_script(const kiln_test::TempDir& dir, const std::string& name, const std::string& body) {
  const std::string path = dir.file(name);
  std::ofstream(path) << body;
  return path;
}

inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The file's lines once it has at least `n` (ranks append to it as they get going), or what it has
// after `timeout`.
inline std::vector<std::string> wait_for_lines(const std::string& path, std::size_t n,
                                               std::chrono::seconds timeout = std::chrono::seconds(30)) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    std::ifstream f(path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(f, line);) lines.push_back(line);
    if (lines.size() >= n || Clock::now() >= deadline) return lines;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Alive and not a zombie (a zombie has ended; its new parent may not have waited for it yet).
inline bool alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  const std::size_t paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() || text[paren + 2] != 'Z';
}

// PORT and PORT+1 both free on `host` a moment ago: kiln-run's launchers take PORT, rank 0 PORT+1.
inline int free_port_pair(const std::string& host) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int port = kiln::dist::detail::free_tcp_port();
    if (port >= 65535) continue;
    std::string why;
    kiln::dist::detail::Fd a(kiln::dist::detail::tcp_listen(host, port, 1, &why));
    kiln::dist::detail::Fd b(kiln::dist::detail::tcp_listen(host, port + 1, 1, &why));
    if (a.get() >= 0 && b.get() >= 0) return port;
  }
  return 0;
}

}  // namespace kiln_run_test
