#include "nvrtc_run.h"

#include <dirent.h>
#include <fcntl.h>
#include <nvrtc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "check.h"

namespace kiln::rt {

namespace {

bool in_process_only() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_COMPILE_IN_PROCESS");
    if (v && *v) return std::string(v) != "0";
    return std::thread::hardware_concurrency() < 4;
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

bool take(const std::string& in, std::size_t& at, std::string& field) {
  std::uint64_t n = 0;
  if (in.size() - at < sizeof n) return false;
  std::memcpy(&n, in.data() + at, sizeof n);
  at += sizeof n;
  if (in.size() - at < n) return false;
  field.assign(in, at, n);
  at += n;
  return true;
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

std::string read_all(int fd) {
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return out;
    out.append(buf, static_cast<std::size_t>(n));
  }
}

// In the child: every descriptor but `keep` closed, so a sibling's pipe reaches end of file
// when that sibling exits, whoever forked in between.
void close_all_but(int keep) {
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return;
  const int own = ::dirfd(d);
  std::vector<int> fds;
  while (const dirent* e = ::readdir(d)) {
    const int fd = std::atoi(e->d_name);
    if (e->d_name[0] >= '0' && e->d_name[0] <= '9' && fd > 2 && fd != keep && fd != own) fds.push_back(fd);
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

std::optional<NvrtcOutput> run_nvrtc_in_child(const std::string& source, const std::string& name,
                                              const std::vector<std::string>& options, bool want_cubin) {
  if (in_process_only()) return std::nullopt;
  prime_nvrtc();
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return std::nullopt;
  pid_t pid = -1;
  {
    std::shared_lock lock(nvrtc_fork_guard());
    pid = ::fork();
  }
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return std::nullopt;
  }
  if (pid == 0) {  // the child: NVRTC, one write, _exit; nothing else of the parent's runs here
    close_all_but(fds[1]);
    int code = 1;
    try {
      const NvrtcOutput out = run_nvrtc(source, name, options, want_cubin);
      std::string bytes(1, out.ok ? '\1' : '\0');
      bytes.append(reinterpret_cast<const char*>(&out.result), sizeof out.result);
      put(bytes, out.log);
      put(bytes, out.ptx);
      put(bytes, out.cubin);
      code = write_all(fds[1], bytes) ? 0 : 1;
    } catch (...) {
      code = 2;
    }
    ::_exit(code);
  }
  ::close(fds[1]);
  const std::string bytes = read_all(fds[0]);
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  NvrtcOutput out;
  std::size_t at = 1 + sizeof out.result;
  if (bytes.size() < at) return std::nullopt;
  out.ok = bytes[0] == '\1';
  std::memcpy(&out.result, bytes.data() + 1, sizeof out.result);
  if (!take(bytes, at, out.log) || !take(bytes, at, out.ptx) || !take(bytes, at, out.cubin) || at != bytes.size())
    return std::nullopt;
  return out;
}

}  // namespace kiln::rt
