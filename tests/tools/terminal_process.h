#pragma once
// Runs jitcc with its stdout on a pseudo-terminal, to see what a person at a terminal sees.
#include <fcntl.h>
#include <pty.h>
#include <sys/ioctl.h>
#include <termios.h>

#include "jitcc_test_util.h"

namespace jitcc_test {

// Runs argv with stdout on a pseudo-terminal (raw: "\n" stays "\n"); `out` is everything
// written to the terminal.
inline ProcessResult run_on_terminal(const std::vector<std::string>& argv, const kiln_test::EnvOverrides& env) {
  int master = -1, slave = -1;
  struct winsize size {};
  size.ws_row = 24, size.ws_col = 250;  // wide enough that no line is cut
  REQUIRE(::openpty(&master, &slave, nullptr, nullptr, &size) == 0);
  struct termios mode {};
  REQUIRE(::tcgetattr(slave, &mode) == 0);
  ::cfmakeraw(&mode);
  REQUIRE(::tcsetattr(slave, TCSANOW, &mode) == 0);

  ::fcntl(master, F_SETFD, FD_CLOEXEC);
  ::fcntl(slave, F_SETFD, FD_CLOEXEC);  // the child keeps only its stdout copy
  kiln_test::Process child(argv, env, slave);
  ::close(slave);  // reads end (EIO) once the child's copy closes

  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(master, buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(master);
  ProcessResult r = child.wait();
  r.out = std::move(out);
  return r;
}

inline ProcessResult jitcc_on_terminal(std::vector<std::string> args) {
  ProcessResult r = run_on_terminal(jitcc_argv(std::move(args)), child_env());
  INFO("terminal output: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  return r;
}

// What remains on screen: the text after the last carriage return.
inline std::string after_progress(const std::string& out) { return out.substr(out.rfind('\r') + 1); }

}  // namespace jitcc_test
