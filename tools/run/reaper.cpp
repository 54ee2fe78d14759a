#include "reaper.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>

namespace kiln_run {

namespace {

using Clock = std::chrono::steady_clock;

bool any_alive(const std::set<pid_t>& groups) {
  for (pid_t g : groups)
    if (::kill(-g, 0) == 0) return true;
  return false;
}

// The reaper's whole life: collect the groups until "done" (exit quietly) or EOF (kiln-run died).
[[noreturn]] void reaper_main(int in, const std::string& dir) {
  std::set<pid_t> groups;
  std::string buffer;
  char chunk[512];
  while (true) {
    const ssize_t n = ::read(in, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buffer.append(chunk, static_cast<std::size_t>(n));
    for (std::size_t nl; (nl = buffer.find('\n')) != std::string::npos;) {
      const std::string line = buffer.substr(0, nl);
      buffer.erase(0, nl + 1);
      if (line == "done") ::_exit(0);
      const pid_t pgid = static_cast<pid_t>(std::atoi(line.c_str() + line.find(' ') + 1));
      if (pgid <= 1) continue;
      if (line.rfind("rank ", 0) == 0) groups.insert(pgid);
      if (line.rfind("gone ", 0) == 0) groups.erase(pgid);
    }
  }
  if (!groups.empty()) {
    std::fprintf(stderr, "kiln-run (reaper): kiln-run died; stopping %zu rank(s) (SIGTERM, SIGKILL after 1 s)\n",
                 groups.size());
    // SIGCONT makes a stopped rank act on the SIGTERM; SIGKILL needs no such help.
    for (pid_t g : groups) ::kill(-g, SIGTERM), ::kill(-g, SIGCONT);
    const auto deadline = Clock::now() + std::chrono::seconds(1);
    while (Clock::now() < deadline && any_alive(groups)) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (pid_t g : groups) ::kill(-g, SIGKILL);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  ::_exit(0);
}

}  // namespace

Reaper::Reaper(const std::string& dir) {
  int fds[2];
  // A socket rather than a pipe: send() with MSG_NOSIGNAL cannot raise SIGPIPE in kiln-run.
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    std::fprintf(stderr, "kiln-run: warning: no reaper (socketpair: %s); ranks may outlive a killed kiln-run\n",
                 std::strerror(errno));
    return;
  }
  std::fflush(nullptr);
  pid_ = ::fork();
  if (pid_ < 0) {
    std::fprintf(stderr, "kiln-run: warning: no reaper (fork: %s); ranks may outlive a killed kiln-run\n",
                 std::strerror(errno));
    ::close(fds[0]);
    ::close(fds[1]);
    return;
  }
  if (pid_ == 0) {
    // Its own group, deaf to the signals meant for kiln-run, holding nothing but its end and stderr.
    ::setpgid(0, 0);
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::signal(s, SIG_IGN);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    const int in = ::fcntl(fds[0], F_DUPFD, 100), null = ::open("/dev/null", O_RDWR);
    ::dup2(null, STDIN_FILENO);
    ::dup2(null, STDOUT_FILENO);
    ::dup2(in, 3);
    ::close_range(4, ~0U, 0);
    reaper_main(3, dir);
  }
  ::close(fds[0]);
  pipe_ = fds[1];
}

Reaper::~Reaper() { done(); }

void Reaper::send(const std::string& line) {
  if (pipe_ < 0) return;
  for (std::size_t sent = 0; sent < line.size();) {
    const ssize_t n = ::send(pipe_, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    sent += static_cast<std::size_t>(n);
  }
}

void Reaper::track(pid_t pgid) { send("rank " + std::to_string(pgid) + "\n"); }
void Reaper::untrack(pid_t pgid) { send("gone " + std::to_string(pgid) + "\n"); }

void Reaper::done() {
  if (pipe_ < 0) return;
  send("done\n");
  ::close(pipe_);
  pipe_ = -1;
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace kiln_run
