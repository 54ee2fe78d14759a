#pragma once
// The TCP transport of the NCCL id rendezvous: rank 0 serves a few bytes to every other rank.
// Hosts are names, IPv4 or IPv6 literals (getaddrinfo); errors start with [dist.rendezvous].
// Internal: the dist layer includes it as "dist/tcp/tcp.h", and kiln-run, whose launchers use
// the socket helpers for their own rendezvous, through the kiln_dist_tcp target (not installed).
#include <chrono>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace kiln::dist::detail {

// Listens on host:port, sends `payload` to each of `clients` connections, then closes. DeviceError
// when the port cannot be bound or not every client connected within `timeout`.
void tcp_serve(const std::string& host, int port, int clients, const std::vector<unsigned char>& payload,
               std::chrono::milliseconds timeout);
// Connects to host:port (retrying while nobody listens) and reads `size` bytes. `rank` is for messages.
std::vector<unsigned char> tcp_fetch(const std::string& host, int port, std::size_t size, int rank,
                                     std::chrono::milliseconds timeout);
// A port on 127.0.0.1 that was free a moment ago (the kernel's pick), for launchers and tests.
int free_tcp_port();

// "host:port", "[::1]:port".
std::string tcp_where(const std::string& host, int port);
// "0.25 s", "300 s": durations in messages.
std::string seconds_text(std::chrono::milliseconds d);

// A listening socket (close-on-exec) on host:port, or -1 with `why` set. When `host` is no address
// of this machine (a name behind NAT), it listens on the wildcard address of that family instead.
int tcp_listen(const std::string& host, int port, int backlog, std::string* why);
// One connection attempt to each address of host:port, bounded by `deadline` (a dropped SYN never
// blocks past it): a connected socket (close-on-exec, blocking), or -1 with `why` set.
int tcp_connect(const std::string& host, int port, std::chrono::steady_clock::time_point deadline, std::string* why);

// Owns a file descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

 private:
  int fd_;
};

}  // namespace kiln::dist::detail
