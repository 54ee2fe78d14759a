#include "nvrtc_run.h"

#include <dlfcn.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "check.h"
#include "kiln/error.h"
#include "kiln/runtime/compiler.h"
#include "kiln/runtime/kernel_plan.h"
#include "kiln/runtime/log.h"
#include "server_environment.h"

extern char** environ;

namespace kiln::rt {

namespace {

bool in_process_only() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_COMPILE_IN_PROCESS");
    return v && *v && std::string(v) != "0";
  }();
  return on;
}

std::optional<std::filesystem::path> find_server() {
  if (const char* env = std::getenv("KILN_NVRTC_SERVER"); env && *env) {
    if (::access(env, X_OK) == 0) return std::filesystem::path(env);
    log().warn("KILN_NVRTC_SERVER={} is not an executable file; NVRTC compiles in this process", env);
    return std::nullopt;
  }
  Dl_info info{};
  if (::dladdr(reinterpret_cast<const void*>(&nvrtc_server_path), &info) == 0 || !info.dli_fname) return std::nullopt;
  const std::filesystem::path lib_dir = std::filesystem::path(info.dli_fname).parent_path();
  for (const std::filesystem::path& p :
       {lib_dir / "kiln-nvrtc-server", lib_dir / KILN_NVRTC_SERVER_FROM_LIBDIR / "kiln-nvrtc-server"})
    if (::access(p.c_str(), X_OK) == 0) return p.lexically_normal();
  return std::nullopt;
}

// Servers that failed to start or ended before their first answer (one that cannot load NVRTC,
// say); after three, none is started again rather than one per compile.
std::atomic<int> stillborn_servers{0};
std::atomic<bool> servers_lowered{true};
std::atomic<bool> abandoning{false};

thread_local std::atomic<bool> t_abandonable{false};

// The servers of prefetch threads, with their thread's flag: abandon_background_compiles kills
// those whose compile is abandonable.
struct BackgroundServers {
  std::mutex mu;
  std::map<pid_t, const std::atomic<bool>*> abandonable;
};
BackgroundServers& background_servers() {
  static auto* b = new BackgroundServers;  // leaked: threads may stop their servers at exit
  return *b;
}
constexpr int kStillbornLimit = 3;

void note_stillborn() {
  if (++stillborn_servers == kStillbornLimit)
    log().warn("{} compile servers failed to start or ended before answering; NVRTC compiles in this process "
               "from now on",
               kStillbornLimit);
}

// One server per thread that compiles, started on its first compile and kept: a start per
// compile would load NVRTC each time. It exits when the thread does.
class Server {
 public:
  ~Server() { stop(); }

  std::optional<NvrtcOutput> run(const NvrtcRequest& req) {
    if (abandoning && t_abandonable) return std::nullopt;  // run_nvrtc says why
    if (pid_ <= 0) {
      if (stillborn_servers >= kStillbornLimit || !nvrtc_server_path()) return std::nullopt;
      if (!start()) {
        note_stillborn();
        return std::nullopt;
      }
    }
    std::optional<NvrtcOutput> out;
    if (send_request(fd_, req) && (out = receive_output(fd_))) {
      if (!answered_)  // a cold run's first waits are mostly its servers' first compiles
        log().debug("[nvrtc] compile server {} answered its first compile ({}) {:.1f} ms after its start", pid_,
                    req.name,
                    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started_).count());
      answered_ = true;
      return out;
    }
    if (!answered_ && !abandoning) note_stillborn();
    stop();  // the next compile starts a new one
    return std::nullopt;
  }

 private:
  bool start() {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return false;
    // The server's end becomes its stdin and stdout; every other descriptor closes at its exec.
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, sv[1], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, sv[1], STDOUT_FILENO);
    std::string exe = nvrtc_server_path()->string(), protocol = kNvrtcServerProtocol, lowered = kNvrtcServerLowered;
    char* argv[] = {exe.data(), protocol.data(), compile_servers_lowered() ? lowered.data() : nullptr, nullptr};
    std::vector<std::string> env = compile_server_environment(environ);
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_t pid = -1;
    const int err = ::posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv, envp.data());
    posix_spawn_file_actions_destroy(&actions);
    ::close(sv[1]);
    if (err != 0) {
      ::close(sv[0]);
      log().debug("could not start the compile server {} ({})", exe, std::strerror(err));
      return false;
    }
    pid_ = pid;
    fd_ = sv[0];
    started_ = std::chrono::steady_clock::now();
    if (on_prefetch_thread()) {
      std::lock_guard lock(background_servers().mu);
      background_servers().abandonable.emplace(pid, &t_abandonable);
    }
    return true;
  }

  void stop() {
    if (pid_ <= 0) return;
    {
      std::lock_guard lock(background_servers().mu);
      background_servers().abandonable.erase(pid_);
    }
    ::close(fd_);  // the server reads end of input and exits
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    answered_ = false;
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  bool answered_ = false;
  std::chrono::steady_clock::time_point started_;
};

// Throws CudaError for an NVRTC call other than the compile that failed, wherever it ran.
NvrtcOutput checked(NvrtcOutput out) {
  if (!out.failed_call.empty()) detail::throw_nvrtc(out.result, out.failed_call.c_str(), __FILE__, __LINE__);
  return out;
}

}  // namespace

void set_compile_servers_lowered(bool lowered) { servers_lowered.store(lowered, std::memory_order_relaxed); }
bool compile_servers_lowered() { return servers_lowered.load(std::memory_order_relaxed); }

const std::optional<std::filesystem::path>& nvrtc_server_path() {
  // Leaked: prefetch threads still start servers while static destructors run at exit.
  static const auto* path = new std::optional<std::filesystem::path>([] {
    std::optional<std::filesystem::path> p = find_server();
    if (!p) log().info("no kiln-nvrtc-server beside libkiln_runtime: NVRTC compiles in this process");
    return p;
  }());
  return *path;
}

NvrtcOutput run_nvrtc_in_process(const NvrtcRequest& req) { return checked(nvrtc_compile(req)); }

std::optional<NvrtcOutput> run_nvrtc_in_server(const NvrtcRequest& req) {
  if (in_process_only()) return std::nullopt;
  thread_local Server server;
  return server.run(req);
}

NvrtcOutput run_nvrtc(const NvrtcRequest& req) {
  if (std::optional<NvrtcOutput> out = run_nvrtc_in_server(req)) return checked(std::move(*out));
  if (abandoning && t_abandonable) throw Error("[nvrtc] compile of " + req.name + " stopped: the process exits");
  return run_nvrtc_in_process(req);
}

void abandon_background_compiles() {
  abandoning = true;
  std::lock_guard lock(background_servers().mu);
  for (const auto& [pid, abandonable] : background_servers().abandonable)
    if (abandonable->load()) ::kill(pid, SIGKILL);  // each thread reaps its own
}

void set_compiles_abandonable(bool abandonable) { t_abandonable = abandonable; }

}  // namespace kiln::rt
