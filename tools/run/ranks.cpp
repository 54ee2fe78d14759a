#include "ranks.h"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace kiln_run {

namespace {

using Clock = std::chrono::steady_clock;

// Each rank leads its own process group, so a signal reaches what it started too (sh -c ...).
// PDEATHSIG is the second line behind the reaper should kiln-run be killed.
pid_t spawn(const std::vector<std::string>& program, const std::vector<std::string>& env, const sigset_t& mask) {
  std::vector<char*> argv, envp;
  for (const auto& a : program) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  // Built before the fork: the child only calls async-signal-safe functions, and one write keeps
  // the ranks' messages from interleaving.
  const std::string exec_failed = "kiln-run: cannot run " + program[0] + ": ";
  const pid_t parent = ::getpid();
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) ::_exit(128 + SIGTERM);  // kiln-run died before prctl took effect
  ::sigprocmask(SIG_SETMASK, &mask, nullptr);
  ::execvpe(argv[0], argv.data(), envp.data());
  char line[512];
  const int n = std::snprintf(line, sizeof line, "%s%s\n", exec_failed.c_str(), std::strerror(errno));
  (void)!::write(STDERR_FILENO, line, static_cast<std::size_t>(std::min(n, static_cast<int>(sizeof line) - 1)));
  ::_exit(127);
}

}  // namespace

std::string how(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  const int sig = WTERMSIG(status);
  const char* name = strsignal(sig);
  return "was killed by signal " + std::to_string(sig) + " (" + (name ? name : "?") + ")";
}

int code_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

void Ranks::start(const std::vector<std::string>& program, const std::vector<std::vector<std::string>>& envs,
                  const sigset_t& mask) {
  ranks_.assign(envs.size(), {});
  unstarted_.clear();
  kill_at_.reset();
  killed_ = false;
  for (std::size_t r = 0; r < envs.size(); ++r) {
    const pid_t pid = spawn(program, envs[r], mask);
    if (pid < 0) {
      std::fprintf(stderr, "kiln-run: cannot start local rank %zu: %s\n", r, std::strerror(errno));
      unstarted_.push_back({static_cast<int>(r), -1, 1 << 8});  // as if it exited 1
      continue;
    }
    ::setpgid(pid, pid);  // also here, so that a signal sent before the child ran reaches its group
    reaper_.track(pid);
    ranks_[r] = {pid, true};
  }
}

void Ranks::signal_all(int sig) {
  for (const Rank& r : ranks_)
    if (r.running) ::kill(-r.pid, sig), ::kill(-r.pid, SIGCONT);
  if (!kill_at_ && sig != SIGKILL)
    kill_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_s_));
}

std::vector<RankExit> Ranks::reap() {
  std::vector<RankExit> out = std::move(unstarted_);
  unstarted_.clear();
  for (std::size_t r = 0; r < ranks_.size(); ++r) {
    Rank& rank = ranks_[r];
    if (!rank.running) continue;
    int status = 0;
    pid_t got = 0;
    while ((got = ::waitpid(rank.pid, &status, WNOHANG)) < 0 && errno == EINTR) {
    }
    if (got != rank.pid) continue;
    rank.running = false;
    // The group may outlive its leader (a rank's background children); the reaper keeps it.
    if (::kill(-rank.pid, 0) != 0) reaper_.untrack(rank.pid);
    out.push_back({static_cast<int>(r), rank.pid, status});
  }
  return out;
}

void Ranks::tick() {
  if (!kill_at_ || killed_ || Clock::now() < *kill_at_ || running() == 0) return;
  std::fprintf(stderr, "kiln-run: %d rank(s) still running %.3g s after SIGTERM; sending SIGKILL\n", running(),
               grace_s_);
  for (const Rank& r : ranks_)
    if (r.running) ::kill(-r.pid, SIGKILL);
  killed_ = true;
}

int Ranks::running() const {
  return static_cast<int>(std::count_if(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running; }));
}

}  // namespace kiln_run
