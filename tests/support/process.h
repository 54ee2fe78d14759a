#pragma once
// Spawns a program as a child process with stdout and stderr captured, for tests of
// command-line tools and of behaviour across processes. Output goes to temp files,
// not pipes, so several children can run at once without anyone draining pipes.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

extern char** environ;

namespace kiln_test {

struct ProcessResult {
  int exit_code = -1;  // 128 + signal when the child was killed by a signal
  std::string out, err;
};

// NAME=value replaces NAME in the child's environment; a nullopt value removes it.
using EnvOverrides = std::vector<std::pair<std::string, std::optional<std::string>>>;

class Process {
 public:
  // With `stdout_fd` (e.g. a terminal) the child writes there and `out` stays empty.
  Process(const std::vector<std::string>& argv, const EnvOverrides& env = {}, int stdout_fd = -1) {
    out_fd_ = temp_file(out_path_);
    err_fd_ = temp_file(err_path_);
    std::vector<std::string> env_strings = child_environment(env);
    std::vector<char*> cargv, cenv;
    for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    for (const auto& e : env_strings) cenv.push_back(const_cast<char*>(e.c_str()));
    cenv.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, stdout_fd >= 0 ? stdout_fd : out_fd_, STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, err_fd_, STDERR_FILENO);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    int rc = posix_spawn(&pid_, cargv[0], &actions, nullptr, cargv.data(), cenv.data());
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      cleanup();
      throw std::runtime_error("cannot spawn " + argv[0] + ": " + std::strerror(rc));
    }
  }
  ~Process() {
    if (pid_ > 0) {
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
    cleanup();
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }  // to signal the child; -1 once waited for

  // Waits for the child and returns its exit code and everything it wrote.
  ProcessResult wait() {
    ProcessResult r;
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = slurp(out_fd_);
    r.err = slurp(err_fd_);
    cleanup();
    return r;
  }

 private:
  static int temp_file(std::string& path) {
    const char* tmp = std::getenv("TMPDIR");
    path = std::string(tmp && *tmp ? tmp : "/tmp") + "/kiln-proc-XXXXXX";
    int fd = ::mkstemp(path.data());
    if (fd < 0) throw std::runtime_error("mkstemp failed: " + std::string(std::strerror(errno)));
    return fd;
  }

  static std::string slurp(int fd) {
    std::string s;
    char buf[65536];
    ::lseek(fd, 0, SEEK_SET);
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) != 0;) {
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) break;
      s.append(buf, static_cast<std::size_t>(n));
    }
    return s;
  }

  static std::vector<std::string> child_environment(const EnvOverrides& env) {
    std::vector<std::string> out;
    for (char** e = environ; *e; ++e) {
      std::string entry = *e;
      std::string name = entry.substr(0, entry.find('='));
      bool overridden = false;
      for (const auto& [k, v] : env) overridden = overridden || k == name;
      if (!overridden) out.push_back(entry);
    }
    for (const auto& [k, v] : env)
      if (v) out.push_back(k + "=" + *v);
    return out;
  }

  void cleanup() {
    for (int* fd : {&out_fd_, &err_fd_})
      if (*fd >= 0) ::close(*fd), *fd = -1;
    for (std::string* p : {&out_path_, &err_path_})
      if (!p->empty()) ::unlink(p->c_str()), p->clear();
  }

  pid_t pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  std::string out_path_, err_path_;
};

inline ProcessResult run_process(const std::vector<std::string>& argv, const EnvOverrides& env = {}) {
  return Process(argv, env).wait();
}

}  // namespace kiln_test
