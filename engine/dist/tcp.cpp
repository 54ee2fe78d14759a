#include "tcp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

#include "kiln/error.h"
#include "rendezvous.h"

namespace kiln::dist::detail {

namespace {

using Clock = std::chrono::steady_clock;
// Tells a kiln id from whatever else might answer on the port.
constexpr unsigned char kMagic[8] = {'k', 'i', 'l', 'n', '-', 'i', 'd', '1'};

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

struct Address {
  sockaddr_storage storage{};
  socklen_t len = 0;
  int family = AF_INET;
};

Address parse(const std::string& host, int port) {
  Address a;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&a.storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<std::uint16_t>(port));
    a.len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<std::uint16_t>(port));
    a.len = sizeof(sockaddr_in6);
    a.family = AF_INET6;
  } else {
    throw ValueError("[dist.rendezvous] '" + host + "' is not an IP address literal");
  }
  return a;
}

std::string where(const std::string& host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
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

void tcp_serve(const std::string& host, int port, int clients, const std::vector<unsigned char>& payload,
               std::chrono::milliseconds timeout) {
  const Address a = parse(host, port);
  Fd s(::socket(a.family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int one = 1;
  if (s.get() < 0 || ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      ::bind(s.get(), reinterpret_cast<const sockaddr*>(&a.storage), a.len) != 0 || ::listen(s.get(), clients) != 0)
    throw DeviceError("[dist.rendezvous] rank 0 cannot listen on " + where(host, port) + ": " + std::strerror(errno));
  std::vector<unsigned char> message(std::begin(kMagic), std::end(kMagic));
  message.insert(message.end(), payload.begin(), payload.end());
  const auto deadline = Clock::now() + timeout;
  for (int served = 0; served < clients;) {
    pollfd p{s.get(), POLLIN, 0};
    const int r = ::poll(&p, 1, remaining_ms(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0)
      throw DeviceError("[dist.rendezvous] rank 0 waited " + seconds_text(timeout) + " on " + where(host, port) +
                        " for " + std::to_string(clients) + " other ranks; " + std::to_string(served) +
                        " connected (did every rank start, with the same MASTER_PORT?)");
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
  const Address a = parse(host, port);
  const auto deadline = Clock::now() + timeout;
  std::string last = "nobody listened";
  while (true) {
    Fd s(::socket(a.family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (s.get() >= 0 && ::connect(s.get(), reinterpret_cast<const sockaddr*>(&a.storage), a.len) == 0) {
      std::vector<unsigned char> got(sizeof kMagic + size);
      if (read_all(s.get(), got, deadline)) {
        if (!std::equal(std::begin(kMagic), std::end(kMagic), got.begin()))
          throw DeviceError("[dist.rendezvous] rank " + std::to_string(rank) +
                            ": something other than kiln's rank 0 answers on " + where(host, port) +
                            "; choose another MASTER_PORT");
        return {got.begin() + sizeof kMagic, got.end()};
      }
      last = "the connection closed early";
    } else {
      last = std::strerror(errno);
    }
    if (Clock::now() >= deadline)
      throw DeviceError("[dist.rendezvous] rank " + std::to_string(rank) +
                        " could not get the NCCL id from rank 0 at " + where(host, port) + " within " +
                        seconds_text(timeout) + " (" + last + "); is rank 0 running?");
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
