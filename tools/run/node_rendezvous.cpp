#include "node_rendezvous.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>

namespace kiln_run {

using kiln::dist::detail::Fd;
using Clock = std::chrono::steady_clock;

namespace {

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", s);
  return buf;
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

void send_line(int fd, const std::string& line) {
  const std::string text = line + "\n";
  for (std::size_t sent = 0; sent < text.size();) {
    const ssize_t n = ::send(fd, text.data() + sent, text.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    sent += static_cast<std::size_t>(n);
  }
}

// A node whose machine vanished (no FIN) is noticed within about 25 s instead of hours.
void keep_alive(int fd) {
  const int on = 1, idle = 10, interval = 5, count = 3;
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
}

NodeError signal_error(int sig) {
  return {128 + sig, std::string("got ") + strsignal(sig) + " while the nodes were joining"};
}

}  // namespace

NodeError abort_of(const std::string& rest) {
  std::istringstream in(rest);
  NodeError e{1, ""};
  in >> e.code;
  std::getline(in >> std::ws, e.text);
  return e;
}

int take_signal(int signal_fd) {
  int got = 0;
  signalfd_siginfo info{};
  while (::read(signal_fd, &info, sizeof info) == static_cast<ssize_t>(sizeof info))
    if (info.ssi_signo != SIGCHLD) got = static_cast<int>(info.ssi_signo);
  return got;
}

std::vector<Message> NodeLink::read_lines(Peer& p) {
  std::vector<Message> out;
  char chunk[4096];
  const ssize_t n = ::recv(p.fd.get(), chunk, sizeof chunk, MSG_DONTWAIT);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return out;
  if (n > 0) p.buffer.append(chunk, static_cast<std::size_t>(n));
  for (std::size_t nl; (nl = p.buffer.find('\n')) != std::string::npos;) {
    const std::string line = p.buffer.substr(0, nl);
    p.buffer.erase(0, nl + 1);
    const std::size_t space = line.find(' ');
    out.push_back({p.node, line.substr(0, space), space == std::string::npos ? "" : line.substr(space + 1)});
  }
  if (n <= 0) {
    p.open = false;
    out.push_back({p.node, "eof", ""});
  }
  return out;
}

std::string NodeLink::check_join(const Message& m, int restart, const std::vector<bool>& joined, int* joiner) const {
  std::istringstream in(m.rest);
  int nnodes = 0, nproc = 0, node = -1, their_restart = -1, max_restarts = -1;
  if (!(in >> nnodes >> nproc >> node >> their_restart >> max_restarts))
    return "node 0 got a malformed join at " + master_where() + ": '" + m.rest + "'";
  const std::string who = "node " + std::to_string(node);
  if (nnodes != o_.nnodes)
    return who + " says --nnodes " + std::to_string(nnodes) + ", node 0 says " + std::to_string(o_.nnodes);
  if (node < 1 || node >= o_.nnodes) {
    if (node == 0) return "node rank 0 joined twice";
    return "node rank " + std::to_string(node) + " is not below --nnodes " + std::to_string(o_.nnodes);
  }
  if (joined[static_cast<std::size_t>(node)] || (m.node > 0 && m.node != node))
    return "node rank " + std::to_string(node) + " joined twice";
  if (nproc != o_.nproc)
    return who + " says --nproc-per-node " + std::to_string(nproc) + ", node 0 says " + std::to_string(o_.nproc);
  if (max_restarts != o_.max_restarts)
    return who + " says --max-restarts " + std::to_string(max_restarts) + ", node 0 says " +
           std::to_string(o_.max_restarts);
  if (their_restart != restart)
    return who + " is at restart " + std::to_string(their_restart) + ", node 0 at restart " + std::to_string(restart);
  *joiner = node;
  return "";
}

void NodeLink::abort_all(const NodeError& e) {
  for (Peer& p : peers_)
    if (p.open) send_line(p.fd.get(), "abort " + std::to_string(e.code) + " " + e.text);
}

void NodeLink::join(int restart, int signal_fd) {
  if (master())
    join_master(restart, signal_fd);
  else
    join_client(restart, signal_fd);
}

void NodeLink::join_master(int restart, int signal_fd) {
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.rdzv_timeout_s));
  Fd listener;
  std::vector<Peer> pending;  // connected, not yet joined; moved into peers_ once they have
  if (peers_.empty()) {
    std::string why;
    listener = Fd(kiln::dist::detail::tcp_listen(o_.master_addr, o_.master_port, o_.nnodes, &why));
    if (listener.get() < 0)
      throw NodeError{1, "node 0 cannot listen on " + master_where() + " (--master-addr, --master-port): " + why};
    peers_.resize(static_cast<std::size_t>(o_.nnodes - 1));
  }
  for (const Peer& p : peers_)
    if (!p.open && listener.get() < 0) {  // a restart, and a node left after the last round
      const NodeError e{1, "lost node " + std::to_string(p.node) + "'s kiln-run"};
      abort_all(e);
      throw e;
    }
  std::vector<bool> joined(static_cast<std::size_t>(o_.nnodes), false);
  joined[0] = true;
  auto fail = [&](const NodeError& e) {
    abort_all(e);
    for (Peer& p : pending) send_line(p.fd.get(), "abort " + std::to_string(e.code) + " " + e.text);
    return e;
  };
  while (std::count(joined.begin(), joined.end(), true) < o_.nnodes) {
    std::vector<pollfd> fds{{signal_fd, POLLIN, 0}, {listener.get(), POLLIN, 0}};
    for (Peer& p : pending) fds.push_back({p.fd.get(), POLLIN, 0});
    const std::size_t polled = pending.size();  // an accept below adds to `pending`, not to `fds`
    for (Peer& p : peers_) fds.push_back({p.open ? p.fd.get() : -1, POLLIN, 0});
    const int r = ::poll(fds.data(), fds.size(), held_.empty() ? remaining_ms(deadline) : 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0 && held_.empty()) {
      std::string missing;
      for (std::size_t n = 1; n < joined.size(); ++n)
        if (!joined[n]) missing += (missing.empty() ? "" : ", ") + std::to_string(n);
      throw fail({kUsageExit, "node 0 waited " + seconds(o_.rdzv_timeout_s) + " at " + master_where() +
                                  " for node(s) " + missing +
                                  " (started with the same --master-addr and --master-port?)"});
    }
    if (fds[0].revents)
      if (const int sig = take_signal(signal_fd)) throw fail(signal_error(sig));
    if (fds[1].revents) {
      Fd c(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (c.get() >= 0) keep_alive(c.get()), pending.push_back({std::move(c), "", true, 0});
    }
    std::vector<Message> got = std::move(held_);
    held_.clear();
    for (std::size_t i = 0; i < polled; ++i)
      if (fds[2 + i].revents)
        for (Message& m : read_lines(pending[i]))
          got.push_back(std::move(m)), got.back().node = -1 - static_cast<int>(i);
    for (std::size_t i = 0; i < peers_.size(); ++i)
      if (fds[2 + polled + i].revents)
        for (Message& m : read_lines(peers_[i])) got.push_back(std::move(m));
    for (const Message& m : got) {
      if (m.kind == "eof" && m.node < 0) continue;  // a connection that never joined
      if (m.node < 0 && pending[static_cast<std::size_t>(-1 - m.node)].fd.get() < 0) continue;
      if (m.kind == "eof")
        throw fail({1, "lost node " + std::to_string(m.node) + "'s kiln-run while the nodes were joining"});
      if (m.kind == "abort") throw fail(abort_of(m.rest));
      if (m.kind != "join" && m.node > 0) continue;  // the end of the last round, still arriving
      if (m.kind != "join") {                        // not a kiln-run: hang up on it
        pending[static_cast<std::size_t>(-1 - m.node)].fd.reset();
        continue;
      }
      int node = 0;
      const std::string error = check_join({std::max(m.node, 0), m.kind, m.rest}, restart, joined, &node);
      if (!error.empty()) throw fail({kUsageExit, error});
      joined[static_cast<std::size_t>(node)] = true;
      if (m.node < 0) {
        Peer& p = pending[static_cast<std::size_t>(-1 - m.node)];
        p.node = node;
        peers_[static_cast<std::size_t>(node - 1)] = std::move(p);
      }
    }
    std::erase_if(pending, [](const Peer& p) { return !p.open || p.fd.get() < 0; });
  }
  send("go");
}

void NodeLink::join_client(int restart, int signal_fd) {
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.rdzv_timeout_s));
  if (peers_.empty()) {
    std::string why;
    while (true) {
      Fd c(kiln::dist::detail::tcp_connect(o_.master_addr, o_.master_port, deadline, &why));
      if (c.get() >= 0) {
        keep_alive(c.get());
        peers_.push_back({std::move(c), "", true, 0});
        break;
      }
      if (Clock::now() >= deadline)
        throw NodeError{kUsageExit, "cannot reach the master " + master_where() + " within " +
                                        seconds(o_.rdzv_timeout_s) +
                                        " (is node 0's kiln-run started? is the port open?); last try: " + why};
      pollfd p{signal_fd, POLLIN, 0};
      if (::poll(&p, 1, std::min(100, remaining_ms(deadline))) > 0)
        if (const int sig = take_signal(signal_fd)) throw signal_error(sig);
    }
  }
  Peer& master = peers_.front();
  if (!master.open) throw NodeError{1, "lost the connection to the master " + master_where()};
  send_line(master.fd.get(), "join " + std::to_string(o_.nnodes) + " " + std::to_string(o_.nproc) + " " +
                                 std::to_string(o_.node_rank) + " " + std::to_string(restart) + " " +
                                 std::to_string(o_.max_restarts));
  while (true) {
    pollfd fds[2] = {{signal_fd, POLLIN, 0}, {master.fd.get(), POLLIN, 0}};
    const int r = ::poll(fds, 2, remaining_ms(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0)
      throw NodeError{kUsageExit, "the master " + master_where() + " did not start the job within " +
                                      seconds(o_.rdzv_timeout_s) + " (are all " + std::to_string(o_.nnodes) +
                                      " nodes started?)"};
    if (fds[0].revents)
      if (const int sig = take_signal(signal_fd)) throw signal_error(sig);
    if (!fds[1].revents) continue;
    for (const Message& m : read_lines(master)) {
      if (m.kind == "go") return;
      if (m.kind == "eof")
        throw NodeError{1, "the master " + master_where() + " closed the connection while the nodes were joining"};
      if (m.kind == "abort") throw abort_of(m.rest);
    }
  }
}

std::vector<Message> NodeLink::receive(int timeout_ms, int signal_fd, bool* signalled) {
  std::vector<pollfd> fds{{signal_fd, POLLIN, 0}};
  for (Peer& p : peers_) fds.push_back({p.open ? p.fd.get() : -1, POLLIN, 0});
  std::vector<Message> out;
  if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) return out;
  *signalled = fds[0].revents != 0;
  for (std::size_t i = 0; i < peers_.size(); ++i)
    if (fds[1 + i].revents)
      for (Message& m : read_lines(peers_[i])) (m.kind == "join" ? held_ : out).push_back(std::move(m));
  return out;
}

void NodeLink::send(const std::string& line) {
  for (Peer& p : peers_)
    if (p.open) send_line(p.fd.get(), line);
}

}  // namespace kiln_run
