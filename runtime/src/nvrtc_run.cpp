#include "nvrtc_run.h"

#include <dirent.h>
#include <fcntl.h>
#include <nvrtc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <initializer_list>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>

#include "check.h"

namespace kiln::rt {

namespace {

bool in_process_only() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_COMPILE_IN_PROCESS");
    return v && *v && std::string(v) != "0";
  }();
  return on;
}

// Shared by forks, exclusive for an in-process compile: no fork happens while this process is
// inside NVRTC.
std::shared_mutex& nvrtc_fork_guard() {
  static std::shared_mutex m;
  return m;
}

void put(std::string& out, const std::string& field) {
  const std::uint64_t n = field.size();
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out += field;
}

bool write_all(int fd, const std::string& bytes) {
  for (std::size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

// In the child: every descriptor but `keep` closed, so a sibling's pipe reaches end of file
// when that sibling exits, whoever forked in between.
void close_all_but(std::initializer_list<int> keep) {
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return;
  const int own = ::dirfd(d);
  std::vector<int> fds;
  while (const dirent* e = ::readdir(d)) {
    const int fd = std::atoi(e->d_name);
    if (e->d_name[0] < '0' || e->d_name[0] > '9' || fd <= 2 || fd == own) continue;
    if (std::find(keep.begin(), keep.end(), fd) == keep.end()) fds.push_back(fd);
  }
  ::closedir(d);
  for (int fd : fds) ::close(fd);
}

// One compile, no lock taken: the child runs it, and run_nvrtc_in_process under the guard.
NvrtcOutput run_nvrtc(const std::string& source, const std::string& name, const std::vector<std::string>& options,
                      bool want_cubin) {
  std::vector<const char*> argv;
  for (const auto& o : options) argv.push_back(o.c_str());
  nvrtcProgram prog = nullptr;
  KILN_NVRTC(nvrtcCreateProgram(&prog, source.c_str(), name.c_str(), 0, nullptr, nullptr));
  // Destroy the program on every path out, including throws.
  std::unique_ptr<nvrtcProgram, void (*)(nvrtcProgram*)> guard(&prog, [](nvrtcProgram* p) { nvrtcDestroyProgram(p); });
  NvrtcOutput out;
  const nvrtcResult r = nvrtcCompileProgram(prog, static_cast<int>(argv.size()), argv.data());
  out.result = static_cast<int>(r);
  std::size_t size = 0;
  KILN_NVRTC(nvrtcGetProgramLogSize(prog, &size));
  out.log.assign(size, '\0');
  if (size > 1) KILN_NVRTC(nvrtcGetProgramLog(prog, out.log.data()));
  while (!out.log.empty() && out.log.back() == '\0') out.log.pop_back();
  if (r != NVRTC_SUCCESS) return out;
  KILN_NVRTC(nvrtcGetPTXSize(prog, &size));
  out.ptx.resize(size);
  KILN_NVRTC(nvrtcGetPTX(prog, out.ptx.data()));
  while (!out.ptx.empty() && out.ptx.back() == '\0') out.ptx.pop_back();
  if (want_cubin) {
    KILN_NVRTC(nvrtcGetCUBINSize(prog, &size));
    out.cubin.resize(size);
    KILN_NVRTC(nvrtcGetCUBIN(prog, out.cubin.data()));
  }
  out.ok = true;
  return out;
}

// Loads NVRTC's builtins in the parent before any fork, so no child ever has to (a loader
// lock another thread held at the fork would stay held in the child).
void prime_nvrtc() {
  static std::once_flag once;
  std::call_once(once,
                 [] { run_nvrtc_in_process("__global__ void kiln_prime() {}\n", "prime.cu", {"-std=c++17"}, false); });
}


}  // namespace

NvrtcOutput run_nvrtc_in_process(const std::string& source, const std::string& name,
                                 const std::vector<std::string>& options, bool want_cubin) {
  if (in_process_only()) return run_nvrtc(source, name, options, want_cubin);  // no forks to keep apart from
  std::unique_lock lock(nvrtc_fork_guard());
  return run_nvrtc(source, name, options, want_cubin);
}

namespace {

bool read_exact(int fd, char* p, std::size_t n) {
  for (std::size_t done = 0; done < n;) {
    const ssize_t got = ::read(fd, p + done, n - done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    done += static_cast<std::size_t>(got);
  }
  return true;
}

bool read_field(int fd, std::string& field) {
  std::uint64_t n = 0;
  if (!read_exact(fd, reinterpret_cast<char*>(&n), sizeof n) || n > (std::uint64_t{1} << 32)) return false;
  field.resize(n);
  return read_exact(fd, field.data(), n);
}

// The child's loop: a request (source, name, options, want_cubin) in, NVRTC's output out,
// until the parent closes its end.
[[noreturn]] void serve(int in, int out) {
  // Below the parent's priority: a run's own threads keep their cores while compiles fill the rest.
  const int niceness = ::nice(5);  // a failure leaves the priority as it was
  (void)niceness;
  for (;;) {
    std::string source, name, count, cubin, bytes;
    if (!read_field(in, source) || !read_field(in, name) || !read_field(in, count) || !read_field(in, cubin))
      ::_exit(0);
    std::vector<std::string> options(std::stoul(count));
    for (std::string& o : options)
      if (!read_field(in, o)) ::_exit(0);
    try {
      const NvrtcOutput r = run_nvrtc(source, name, options, cubin == "1");
      bytes.assign(1, r.ok ? '\1' : '\0');
      bytes.append(reinterpret_cast<const char*>(&r.result), sizeof r.result);
      put(bytes, r.log);
      put(bytes, r.ptx);
      put(bytes, r.cubin);
    } catch (...) {
      bytes.assign(1, '\2');  // an NVRTC call failed: the parent compiles in-process and reports it
    }
    if (!write_all(out, bytes)) ::_exit(1);
  }
}

// One compile server per thread that compiles, forked on its first compile: a fork per compile
// would copy the parent's page tables each time. It exits when the thread does.
class Server {
 public:
  ~Server() { stop(); }

  std::optional<NvrtcOutput> run(const std::string& source, const std::string& name,
                                 const std::vector<std::string>& options, bool want_cubin) {
    if (pid_ <= 0 && !start()) return std::nullopt;
    std::string request;
    put(request, source);
    put(request, name);
    put(request, std::to_string(options.size()));
    put(request, want_cubin ? "1" : "0");
    for (const std::string& o : options) put(request, o);
    NvrtcOutput out;
    char head[1 + sizeof out.result];
    if (!write_all(to_, request) || !read_exact(from_, head, 1) || head[0] == '\2' ||
        !read_exact(from_, head + 1, sizeof out.result) || !read_field(from_, out.log) ||
        !read_field(from_, out.ptx) || !read_field(from_, out.cubin)) {
      stop();  // a dead or confused server: the next compile forks a new one
      return std::nullopt;
    }
    out.ok = head[0] == '\1';
    std::memcpy(&out.result, head + 1, sizeof out.result);
    return out;
  }

 private:
  bool start() {
    prime_nvrtc();
    int down[2], up[2];
    if (::pipe2(down, O_CLOEXEC) != 0) return false;
    if (::pipe2(up, O_CLOEXEC) != 0) {
      ::close(down[0]);
      ::close(down[1]);
      return false;
    }
    pid_t pid = -1;
    {
      std::shared_lock lock(nvrtc_fork_guard());
      pid = ::fork();
    }
    if (pid == 0) {
      close_all_but({down[0], up[1]});
      serve(down[0], up[1]);
    }
    ::close(down[0]);
    ::close(up[1]);
    if (pid < 0) {
      ::close(down[1]);
      ::close(up[0]);
      return false;
    }
    pid_ = pid;
    to_ = down[1];
    from_ = up[0];
    return true;
  }

  void stop() {
    if (pid_ <= 0) return;
    ::close(to_);
    ::close(from_);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }

  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
};

}  // namespace

std::optional<NvrtcOutput> run_nvrtc_in_child(const std::string& source, const std::string& name,
                                              const std::vector<std::string>& options, bool want_cubin) {
  if (in_process_only()) return std::nullopt;
  thread_local Server server;
  return server.run(source, name, options, want_cubin);
}

}  // namespace kiln::rt
