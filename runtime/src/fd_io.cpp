#include "fd_io.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace kiln::rt {

namespace {

template <typename Write>
bool write_loop(const std::string& bytes, Write write) {
  for (std::size_t done = 0; done < bytes.size();) {
    const ssize_t n = write(bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) errno = EIO;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace

bool write_all(int fd, const std::string& bytes) {
  return write_loop(bytes, [fd](const char* p, std::size_t n) { return ::write(fd, p, n); });
}

bool send_all(int fd, const std::string& bytes) {
  return write_loop(bytes, [fd](const char* p, std::size_t n) { return ::send(fd, p, n, MSG_NOSIGNAL); });
}

bool read_exact(int fd, char* p, std::size_t n) {
  for (std::size_t done = 0; done < n;) {
    const ssize_t got = ::read(fd, p + done, n - done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    done += static_cast<std::size_t>(got);
  }
  return true;
}

}  // namespace kiln::rt
