#pragma once
// The launchers of several nodes, connected: node 0's kiln-run listens on master-addr:master-port,
// every other node's kiln-run connects. One line per message; the connections stay open while the
// ranks run, so that a failure anywhere reaches every node through node 0.
//   node -> 0:  join NNODES NPROC NODE_RANK RESTART MAX_RESTARTS | failed RANK CODE HOW | done | abort CODE TEXT
//   0 -> node:  go | stop RANK CODE HOW | exit 0 | abort CODE TEXT
#include <string>
#include <vector>

#include "tcp.h"
#include "options.h"

namespace kiln_run {

// The launchers could not (or no longer) agree: every kiln-run prints "kiln-run: error: TEXT" and
// exits with `code`.
struct NodeError {
  int code;
  std::string text;
};

// An "abort CODE TEXT" message's CODE and TEXT.
NodeError abort_of(const std::string& rest);

struct Message {
  int node = 0;      // who sent it (node 0 for a client)
  std::string kind;  // the first word; "eof" when the connection closed
  std::string rest;  // the words after it
};

// SIGINT, SIGTERM or SIGHUP read from kiln-run's signalfd, else 0 (SIGCHLD is drained and ignored).
int take_signal(int signal_fd);

class NodeLink {
 public:
  explicit NodeLink(const Options& options) : o_(options) {}
  bool master() const { return o_.node_rank == 0; }
  std::string master_where() const { return kiln::dist::detail::tcp_where(o_.master_addr, o_.master_port); }

  // Every node joins with the same flags and restart count before any starts its ranks; the first
  // call connects, later ones (restarts) reuse the connections. Throws NodeError. A signal on
  // `signal_fd` (a signalfd) ends the wait: NodeError with 128 + the signal.
  void join(int restart, int signal_fd);

  // Waits up to `timeout_ms` for messages (or for `signal_fd`, whose readiness sets *signalled).
  std::vector<Message> receive(int timeout_ms, int signal_fd, bool* signalled);
  // To node 0 (from a client) or to every node (from node 0). Best effort: a lost peer shows up
  // as an "eof" message.
  void send(const std::string& line);

 private:
  struct Peer {
    kiln::dist::detail::Fd fd;
    std::string buffer;
    bool open = false;
    int node = 0;
  };
  void join_master(int restart, int signal_fd);
  void join_client(int restart, int signal_fd);
  // Lines from `p` that arrived (reads once; "eof" at the end of the stream).
  std::vector<Message> read_lines(Peer& p);
  // "" with *joiner set to its node rank, or the reason this join disagrees with node 0.
  std::string check_join(const Message& m, int restart, const std::vector<bool>& joined, int* joiner) const;
  void abort_all(const NodeError& e);

  const Options& o_;
  std::vector<Message> held_;  // joins for the next round that arrived with the end of this one
  std::vector<Peer> peers_;    // node 0: one per other node (by node rank - 1); a client: the master
};

}  // namespace kiln_run
