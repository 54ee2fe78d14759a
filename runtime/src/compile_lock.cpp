#include "compile_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <system_error>
#include <thread>

#include "kiln/runtime/log.h"

namespace kiln::rt {

namespace fs = std::filesystem;

namespace {

// Whether `fd` is still the file at `path`: a holder removes the file before releasing it, so a
// waiter that then gets the lock of the removed file must open the path again.
bool still_linked(int fd, const fs::path& path) {
  struct stat held {}, named {};
  return ::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
         held.st_dev == named.st_dev;
}

}  // namespace

std::optional<CompileLock> CompileLock::acquire(const DiskCache& cache, const std::string& digest, double wait_s) {
  if (!cache.writable()) return std::nullopt;
  const fs::path dir = cache.dir() / "locks", path = dir / digest;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return std::nullopt;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  auto pause = std::chrono::microseconds(500);
  for (;;) {
    const int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (fd < 0) return std::nullopt;
    // Polled rather than blocking, so that the wait is bounded.
    while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) {  // no locks on this file system
        ::close(fd);
        return std::nullopt;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        log().debug("[cache] {} stayed locked by another process for {} s; compiling it here too", digest, wait_s);
        ::close(fd);
        return std::nullopt;
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(20000));
    }
    if (still_linked(fd, path)) return CompileLock(fd, path);
    ::close(fd);  // its holder finished and removed it: take the path's current file
  }
}

CompileLock::CompileLock(CompileLock&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) {
  other.fd_ = -1;
}

CompileLock& CompileLock::operator=(CompileLock&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = other.fd_, path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

void CompileLock::release() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());
  ::close(fd_);
  fd_ = -1;
}

}  // namespace kiln::rt
