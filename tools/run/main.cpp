// kiln-run: starts N processes of one program for kiln::dist, one per GPU, as torchrun does:
// RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/MASTER_PORT and KILN_DIST_ID_FILE set for each.
// When one rank fails the others are stopped (SIGTERM, SIGKILL after --grace) and kiln-run exits
// with the failed rank's code (128 + signal when killed), so a job never hangs on a dead peer.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "dist/tcp.h"
#include "kiln/dist.h"
#include "version_text.h"

extern char** environ;

namespace {

constexpr int kUsageExit = 2;
using Clock = std::chrono::steady_clock;

struct Rank {
  pid_t pid = -1;
  bool running = false;
};

int usage_error(const std::string& message) {
  std::fprintf(stderr, "kiln-run: error: %s (run 'kiln-run --help')\n", message.c_str());
  return kUsageExit;
}

// Where kiln-run's options end and the program begins: at "--", or at the first word that is
// neither an option nor an option's value ("kiln-run -n 2 sh -c ...": -c is the program's).
int program_start(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") return i;
    if (a.empty() || a[0] != '-') return i;
    if (a == "-n" || a == "--nproc" || a == "--port" || a == "--grace") ++i;
  }
  return argc;
}

std::vector<std::string> child_environment(int rank, int world, int port, const std::string& id_file) {
  const std::vector<std::pair<std::string, std::string>> set = {
      {"RANK", std::to_string(rank)}, {"LOCAL_RANK", std::to_string(rank)},  {"WORLD_SIZE", std::to_string(world)},
      {"MASTER_ADDR", "127.0.0.1"},   {"MASTER_PORT", std::to_string(port)}, {"KILN_DIST_ID_FILE", id_file}};
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e, name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& kv : set) replaced = replaced || kv.first == name;
    if (!replaced) out.push_back(entry);
  }
  for (const auto& kv : set) out.push_back(kv.first + "=" + kv.second);
  return out;
}

// Each rank leads its own process group, so a signal reaches what it started too (sh -c ...);
// PDEATHSIG stops it should kiln-run itself be killed.
pid_t spawn(const std::vector<std::string>& program, const std::vector<std::string>& env, const sigset_t& mask) {
  std::vector<char*> argv, envp;
  for (const auto& a : program) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  // Built before the fork: the child only calls async-signal-safe functions, and one write keeps
  // the ranks' messages from interleaving.
  const std::string exec_failed = "kiln-run: cannot run " + program[0] + ": ";
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid != 0) return pid;
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  sigprocmask(SIG_SETMASK, &mask, nullptr);
  execvpe(argv[0], argv.data(), envp.data());
  char line[512];
  const int n = std::snprintf(line, sizeof line, "%s%s\n", exec_failed.c_str(), std::strerror(errno));
  (void)!write(STDERR_FILENO, line, static_cast<std::size_t>(std::min(n, static_cast<int>(sizeof line) - 1)));
  _exit(127);
}

void signal_all(std::vector<Rank>& ranks, int sig) {
  for (const Rank& r : ranks)
    if (r.running) kill(-r.pid, sig);
}

std::string how(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  const int sig = WTERMSIG(status);
  const char* name = strsignal(sig);
  return "was killed by signal " + std::to_string(sig) + " (" + (name ? name : "?") + ")";
}

int code_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

}  // namespace

int main(int argc, char** argv) {
  int nproc = 0, port = 0;
  double grace_s = 10;
  CLI::App app{"kiln-run: run N processes of a program for kiln::dist (one per GPU), torchrun-style"};
  kiln::cli::add_version_flag(app);
  app.add_option("-n,--nproc", nproc, "Processes (ranks) to start, 1-64")->required()->check(CLI::Range(1, 64));
  app.add_option("--port", port, "MASTER_PORT for the TCP rendezvous (default: a free port)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--grace", grace_s, "Seconds between SIGTERM and SIGKILL when stopping the ranks")
      ->check(CLI::Range(0.0, 3600.0));
  app.footer(
      "Usage: kiln-run -n N [--port P] [--grace S] [--] program args...\n"
      "Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT and\n"
      "KILN_DIST_ID_FILE; kiln::dist::ProcessGroup::init() reads them.");
  const int split = program_start(argc, argv);
  try {
    app.parse(split, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    std::printf("%s\nNCCL %s\n", kiln::cli::version_text().c_str(),
                kiln::dist::nccl_available() ? kiln::dist::nccl_version().c_str() : ": not found");
    return 0;
  } catch (const CLI::ParseError& e) {
    return usage_error(e.what());
  }
  const int first = split < argc && std::strcmp(argv[split], "--") == 0 ? split + 1 : split;
  if (first >= argc) return usage_error("no program to run: kiln-run -n N [--port P] [--] program args...");
  const std::vector<std::string> program(argv + first, argv + argc);

  std::string dir = std::filesystem::temp_directory_path().string() + "/kiln-run-XXXXXX";
  if (!mkdtemp(dir.data())) {
    std::fprintf(stderr, "kiln-run: error: cannot make a directory like %s: %s\n", dir.c_str(), std::strerror(errno));
    return 1;
  }
  if (port == 0) port = kiln::dist::detail::free_tcp_port();

  // Signals are taken synchronously with sigtimedwait; children get the old mask back.
  sigset_t wanted, old;
  sigemptyset(&wanted);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&wanted, s);
  sigprocmask(SIG_BLOCK, &wanted, &old);

  std::optional<int> failed_rank, failed_status, received;
  std::optional<Clock::time_point> kill_at;
  const auto grace = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_s));
  std::vector<Rank> ranks(static_cast<std::size_t>(nproc));
  int running = 0;
  for (int r = 0; r < nproc && !failed_status; ++r) {
    const pid_t pid = spawn(program, child_environment(r, nproc, port, dir + "/nccl-id"), old);
    if (pid < 0) {
      std::fprintf(stderr, "kiln-run: cannot start rank %d: %s; stopping the others\n", r, std::strerror(errno));
      failed_rank = r;
      failed_status = 1 << 8;  // as if it exited 1
      signal_all(ranks, SIGTERM);
      kill_at = Clock::now() + grace;
      break;
    }
    ranks[static_cast<std::size_t>(r)] = {pid, true};
    ++running;
  }
  while (running > 0) {
    timespec wait{0, 100'000'000};
    siginfo_t info{};
    const int sig = sigtimedwait(&wanted, &info, &wait);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      std::fprintf(stderr, "kiln-run: got %s; passing it to the ranks\n", strsignal(sig));
      received = received.value_or(sig);
      signal_all(ranks, sig);
      if (!kill_at) kill_at = Clock::now() + grace;
    }
    for (int status = 0;;) {
      const pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      for (std::size_t r = 0; r < ranks.size(); ++r) {
        if (ranks[r].pid != pid || !ranks[r].running) continue;
        ranks[r].running = false;
        --running;
        if (code_of(status) != 0 && !failed_rank) {
          failed_rank = static_cast<int>(r);
          failed_status = status;
          std::fprintf(stderr, "kiln-run: rank %zu (pid %d) %s; stopping the other ranks\n", r, static_cast<int>(pid),
                       how(status).c_str());
          signal_all(ranks, SIGTERM);
          if (!kill_at) kill_at = Clock::now() + grace;
        }
      }
    }
    if (kill_at && Clock::now() >= *kill_at && running > 0) {
      std::fprintf(stderr, "kiln-run: %d rank(s) still running %.3g s after SIGTERM; sending SIGKILL\n", running,
                   grace_s);
      signal_all(ranks, SIGKILL);
      kill_at = Clock::time_point::max();
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  // An interrupted job did not succeed, even when every rank exited cleanly on the signal.
  if (failed_status) return code_of(*failed_status);
  return received ? 128 + *received : 0;
}
