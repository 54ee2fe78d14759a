#include "tcp.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "kiln/error.h"

namespace kiln::dist::detail {

namespace {

using Clock = std::chrono::steady_clock;
// Tells a kiln id from whatever else might answer on the port.
constexpr unsigned char kMagic[8] = {'k', 'i', 'l', 'n', '-', 'i', 'd', '1'};

struct Address {
  sockaddr_storage storage{};
  socklen_t len = 0;
  int family = AF_INET;
};

// Every address of host:port, or an empty list with `why` set.
std::vector<Address> resolve(const std::string& host, int port, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  std::vector<Address> out;
  if (rc != 0) {
    *why = "cannot resolve '" + host + "': " + ::gai_strerror(rc);
    return out;
  }
  for (const addrinfo* a = found; a; a = a->ai_next) {
    Address x;
    std::memcpy(&x.storage, a->ai_addr, a->ai_addrlen);
    x.len = a->ai_addrlen;
    x.family = a->ai_family;
    out.push_back(x);
  }
  ::freeaddrinfo(found);
  if (out.empty()) *why = "'" + host + "' has no address";
  return out;
}

Address wildcard(int family, int port) {
  Address a;
  a.family = family;
  if (family == AF_INET6) {
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
    v6->sin6_family = AF_INET6;
    v6->sin6_addr = in6addr_any;
    v6->sin6_port = htons(static_cast<std::uint16_t>(port));
    a.len = sizeof(sockaddr_in6);
  } else {
    auto* v4 = reinterpret_cast<sockaddr_in*>(&a.storage);
    v4->sin_family = AF_INET;
    v4->sin_addr.s_addr = htonl(INADDR_ANY);
    v4->sin_port = htons(static_cast<std::uint16_t>(port));
    a.len = sizeof(sockaddr_in);
  }
  return a;
}

// A listening socket on `a`, or -1 with errno set.
int listen_on(const Address& a, int backlog) {
  Fd s(::socket(a.family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int one = 1;
  if (s.get() < 0 || ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      ::bind(s.get(), reinterpret_cast<const sockaddr*>(&a.storage), a.len) != 0 || ::listen(s.get(), backlog) != 0)
    return -1;
  return s.release();
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

// A connected socket to `a` before the deadline, or -1 with errno set.
int connect_to(const Address& a, Clock::time_point deadline) {
  Fd s(::socket(a.family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (s.get() < 0) return -1;
  if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&a.storage), a.len) != 0) {
    if (errno != EINPROGRESS) return -1;
    pollfd p{s.get(), POLLOUT, 0};
    int r = 0;
    while ((r = ::poll(&p, 1, remaining_ms(deadline))) < 0 && errno == EINTR) {
    }
    if (r == 0) errno = ETIMEDOUT;
    if (r <= 0) return -1;
    int err = 0;
    socklen_t len = sizeof err;
    if (::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) return -1;
    if (err != 0) {
      errno = err;
      return -1;
    }
  }
  ::fcntl(s.get(), F_SETFL, ::fcntl(s.get(), F_GETFL) & ~O_NONBLOCK);
  return s.release();
}

// Reads exactly out.size() bytes before the deadline; false on EOF, error or time out.
bool read_all(int fd, std::vector<unsigned char>& out, Clock::time_point deadline) {
  std::size_t got = 0;
  while (got < out.size()) {
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, remaining_ms(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    const ssize_t n = ::recv(fd, out.data() + got, out.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got += static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string seconds_text(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

std::string tcp_where(const std::string& host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

int tcp_listen(const std::string& host, int port, int backlog, std::string* why) {
  const std::vector<Address> addresses = resolve(host, port, why);
  int not_here = 0;  // the family of an address that is not this machine's
  for (const Address& a : addresses) {
    const int fd = listen_on(a, backlog);
    if (fd >= 0) return fd;
    *why = std::strerror(errno);
    if (errno == EADDRNOTAVAIL && !not_here) not_here = a.family;
  }
  if (not_here) {
    const int fd = listen_on(wildcard(not_here, port), backlog);
    if (fd >= 0) return fd;
    *why = std::string("not an address of this machine, and the wildcard address: ") + std::strerror(errno);
  }
  return -1;
}

int tcp_connect(const std::string& host, int port, Clock::time_point deadline, std::string* why) {
  for (const Address& a : resolve(host, port, why)) {
    const int fd = connect_to(a, deadline);
    if (fd >= 0) return fd;
    *why = std::strerror(errno);
  }
  return -1;
}

void tcp_serve(const std::string& host, int port, int clients, const std::vector<unsigned char>& payload,
               std::chrono::milliseconds timeout) {
  std::string why;
  Fd s(tcp_listen(host, port, clients, &why));
  if (s.get() < 0)
    throw DeviceError("[dist.rendezvous] rank 0 cannot listen on " + tcp_where(host, port) +
                      " (MASTER_ADDR:" + "MASTER_PORT): " + why);
  std::vector<unsigned char> message(std::begin(kMagic), std::end(kMagic));
  message.insert(message.end(), payload.begin(), payload.end());
  const auto deadline = Clock::now() + timeout;
  for (int served = 0; served < clients;) {
    pollfd p{s.get(), POLLIN, 0};
    const int r = ::poll(&p, 1, remaining_ms(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0)
      throw DeviceError("[dist.rendezvous] rank 0 waited " + seconds_text(timeout) + " on " + tcp_where(host, port) +
                        " for " + std::to_string(clients) + " other ranks; " + std::to_string(served) +
                        " connected (did every rank start, with the same MASTER_ADDR and MASTER_PORT?)");
    Fd c(::accept4(s.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (c.get() < 0) continue;  // the peer gave up between poll and accept
    std::size_t sent = 0;
    while (sent < message.size()) {
      const ssize_t n = ::send(c.get(), message.data() + sent, message.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      sent += static_cast<std::size_t>(n);
    }
    if (sent == message.size()) ++served;  // otherwise that rank retries
  }
}

std::vector<unsigned char> tcp_fetch(const std::string& host, int port, std::size_t size, int rank,
                                     std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string last = "nobody listened";
  while (true) {
    Fd s(tcp_connect(host, port, deadline, &last));
    if (s.get() >= 0) {
      std::vector<unsigned char> got(sizeof kMagic + size);
      if (read_all(s.get(), got, deadline)) {
        if (!std::equal(std::begin(kMagic), std::end(kMagic), got.begin()))
          throw DeviceError("[dist.rendezvous] rank " + std::to_string(rank) +
                            ": something other than kiln's rank 0 answers on " + tcp_where(host, port) +
                            "; choose another MASTER_PORT");
        return {got.begin() + sizeof kMagic, got.end()};
      }
      last = "the connection closed early";
    }
    if (Clock::now() >= deadline)
      throw DeviceError("[dist.rendezvous] rank " + std::to_string(rank) +
                        " could not get the NCCL id from rank 0 at " + tcp_where(host, port) + " within " +
                        seconds_text(timeout) + " (" + last + "); is rank 0 running, and MASTER_ADDR reachable?");
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(20, remaining_ms(deadline) + 1)));
  }
}

int free_tcp_port() {
  Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (s.get() < 0 || ::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw DeviceError(std::string("[dist.rendezvous] cannot find a free TCP port: ") + std::strerror(errno));
  return ntohs(a.sin_port);
}

}  // namespace kiln::dist::detail
