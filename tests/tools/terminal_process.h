#pragma once
// Runs jitcc with its stdout on a pseudo-terminal, to see what a person at a terminal sees.
#include <fcntl.h>
#include <pty.h>
#include <spawn.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>

#include "jitcc_test_util.h"

namespace jitcc_test {

// Runs argv with stdout on a pseudo-terminal (raw: "\n" stays "\n") and stderr discarded;
// `out` is everything written to the terminal.
inline ProcessResult run_on_terminal(const std::vector<std::string>& argv, const kiln_test::EnvOverrides& env) {
  int master = -1, slave = -1;
  struct winsize size {};
  size.ws_row = 24, size.ws_col = 250;  // wide enough that no line is cut
  REQUIRE(::openpty(&master, &slave, nullptr, nullptr, &size) == 0);
  struct termios mode {};
  REQUIRE(::tcgetattr(slave, &mode) == 0);
  ::cfmakeraw(&mode);
  REQUIRE(::tcsetattr(slave, TCSANOW, &mode) == 0);

  std::vector<std::string> env_strings = kiln_test::child_environment(env);
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : env_strings) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, slave, STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addclose(&actions, master);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, cargv[0], &actions, nullptr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(slave);  // reads end (EIO) once the child's copy closes
  REQUIRE(rc == 0);

  ProcessResult r;
  char buf[4096];
  for (ssize_t n; (n = ::read(master, buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    r.out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(master);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

inline ProcessResult jitcc_on_terminal(std::vector<std::string> args) {
  ProcessResult r = run_on_terminal(jitcc_argv(std::move(args)), child_env());
  INFO("terminal output: " << r.out);
  REQUIRE(r.exit_code == 0);
  return r;
}

// What remains on screen: the text after the last carriage return.
inline std::string after_progress(const std::string& out) { return out.substr(out.rfind('\r') + 1); }

}  // namespace jitcc_test
