// kiln-run's main loop: start this node's ranks, watch them, the signals kiln-run gets and (with
// several nodes) the other launchers; stop every rank when one fails, then restart them all or
// exit with the failed rank's code.
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <sstream>

#include "node_rendezvous.h"
#include "options.h"
#include "ranks.h"
#include "reaper.h"

extern char** environ;

namespace kiln_run {

namespace {

std::vector<std::string> rank_environment(const Options& o, int local, int restart, const std::string& id_file) {
  std::vector<std::pair<std::string, std::string>> set = {{"RANK", std::to_string(o.global_rank(local))},
                                                          {"LOCAL_RANK", std::to_string(local)},
                                                          {"WORLD_SIZE", std::to_string(o.world_size())},
                                                          {"LOCAL_WORLD_SIZE", std::to_string(o.nproc)},
                                                          {"GROUP_RANK", std::to_string(o.node_rank)},
                                                          {"MASTER_ADDR", o.master_addr},
                                                          {"MASTER_PORT", std::to_string(o.ranks_port())},
                                                          {"KILN_RESTART_COUNT", std::to_string(restart)},
                                                          {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart)}};
  if (!id_file.empty()) set.emplace_back("KILN_DIST_ID_FILE", id_file);
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e, name = entry.substr(0, entry.find('='));
    bool replaced = name == "KILN_DIST_ID_FILE";  // several nodes share no file: never pass one on
    for (const auto& kv : set) replaced = replaced || kv.first == name;
    if (!replaced) out.push_back(entry);
  }
  for (const auto& kv : set) out.push_back(kv.first + "=" + kv.second);
  return out;
}

struct Failure {
  int rank = 0, code = 0;
  std::string how;
};

// What one start of the ranks came to, on this node.
struct Outcome {
  std::optional<Failure> failure;  // the job's first failed rank: a restart may follow
  std::optional<int> abort_code;   // the job ends without a restart (a signal on a node, a lost node)
  int signal = 0;                  // a signal this kiln-run got
  bool success = false;            // every rank of every node exited 0
};

// "RANK CODE HOW" of a stop or failed message.
Failure failure_of(const std::string& rest) {
  std::istringstream in(rest);
  Failure f;
  in >> f.rank >> f.code;
  std::getline(in >> std::ws, f.how);
  return f;
}

class Round {
 public:
  Round(const Options& o, Ranks& ranks, NodeLink* link) : o_(o), ranks_(ranks), link_(link) {
    nodes_done_.assign(static_cast<std::size_t>(o.nnodes), false);
  }

  Outcome run(int signal_fd) {
    while (true) {
      bool signalled = false;
      std::vector<Message> messages;
      if (link_) {
        messages = link_->receive(100, signal_fd, &signalled);
      } else {
        pollfd p{signal_fd, POLLIN, 0};
        signalled = ::poll(&p, 1, 100) > 0;
      }
      if (signalled)
        if (const int sig = take_signal(signal_fd)) on_signal(sig);
      for (const Message& m : messages) master() ? on_node_message(m) : on_master_message(m);
      for (const RankExit& e : ranks_.reap()) on_exit(e);
      if (ranks_.running() == 0 && !local_failed_ && !local_done_ && !out_.signal) {
        local_done_ = true;
        nodes_done_[0] = true;
        if (link_ && !master()) link_->send("done");
      }
      if (master() && !decided() && std::find(nodes_done_.begin(), nodes_done_.end(), false) == nodes_done_.end()) {
        out_.success = true;
        if (link_) link_->send("exit 0");
      }
      ranks_.tick();
      if (ranks_.running() == 0 && (decided() || out_.signal)) return out_;
    }
  }

 private:
  bool master() const { return !link_ || link_->master(); }
  bool decided() const { return out_.failure || out_.abort_code || out_.success; }

  void stop_job(const Failure& f) {
    out_.failure = f;
    ranks_.stop();
    if (link_) link_->send("stop " + std::to_string(f.rank) + " " + std::to_string(f.code) + " " + f.how);
  }
  void abort_job(int code, const std::string& text) {
    out_.abort_code = code;
    ranks_.stop();
    if (link_ && master()) link_->send("abort " + std::to_string(code) + " " + text);
  }

  void on_signal(int sig) {
    std::fprintf(stderr, "kiln-run: got %s; passing it to the ranks\n", strsignal(sig));
    if (!out_.signal) out_.signal = sig;
    ranks_.signal_all(sig);
    if (!link_) return;
    const std::string text = "node " + std::to_string(o_.node_rank) + "'s kiln-run got " + strsignal(sig);
    if (!master())
      link_->send("abort " + std::to_string(128 + sig) + " " + text);
    else if (!out_.abort_code)  // even after a failure: no node may restart now
      abort_job(128 + sig, text);
  }

  void on_exit(const RankExit& e) {
    const int code = code_of(e.status);
    if (code == 0 || local_failed_ || out_.abort_code || (link_ && out_.failure)) return;
    local_failed_ = true;
    const Failure f{o_.global_rank(e.local), code, how(e.status)};
    std::fprintf(stderr, "kiln-run: rank %d (pid %d) %s; stopping the other ranks\n", f.rank, static_cast<int>(e.pid),
                 f.how.c_str());
    ranks_.stop();
    if (!link_) {
      out_.failure = f;
    } else if (master()) {
      if (!decided()) stop_job(f);
    } else if (!out_.signal) {
      link_->send("failed " + std::to_string(f.rank) + " " + std::to_string(f.code) + " " + f.how);
    }
  }

  // Node 0 hears from node m.node.
  void on_node_message(const Message& m) {
    const std::string node = "node " + std::to_string(m.node);
    if (m.kind == "done") nodes_done_[static_cast<std::size_t>(m.node)] = true;
    // An abort wins over an earlier failure: no node may restart after it.
    if (out_.success || out_.abort_code || (out_.failure && m.kind == "failed")) return;
    if (m.kind == "failed") {
      const Failure f = failure_of(m.rest);
      std::fprintf(stderr, "kiln-run: rank %d (on %s) %s; stopping the ranks\n", f.rank, node.c_str(), f.how.c_str());
      stop_job(f);
    } else if (m.kind == "abort") {
      const NodeError e = abort_of(m.rest);
      std::fprintf(stderr, "kiln-run: %s; stopping the ranks\n", e.text.c_str());
      abort_job(e.code, e.text);
    } else if (m.kind == "eof") {
      std::fprintf(stderr, "kiln-run: error: lost %s's kiln-run; stopping the ranks\n", node.c_str());
      abort_job(1, "lost " + node + "'s kiln-run");
    }
  }

  // A node hears from node 0.
  void on_master_message(const Message& m) {
    if (m.kind == "exit") {
      out_.success = true;
    } else if (m.kind == "stop" && !out_.failure) {
      const Failure f = failure_of(m.rest);
      if (!local_failed_) std::fprintf(stderr, "kiln-run: rank %d %s; stopping the ranks\n", f.rank, f.how.c_str());
      out_.failure = f;
      ranks_.stop();
    } else if (m.kind == "abort" && !out_.abort_code) {
      const NodeError e = abort_of(m.rest);
      if (!out_.signal) std::fprintf(stderr, "kiln-run: %s; stopping the ranks\n", e.text.c_str());
      abort_job(e.code, e.text);
    } else if (m.kind == "eof" && !out_.success && !out_.abort_code) {
      std::fprintf(stderr,
                   "kiln-run: error: lost the connection to the master %s (did node 0's kiln-run die?); stopping "
                   "the ranks\n",
                   link_->master_where().c_str());
      abort_job(1, "lost the master");
    }
  }

  const Options& o_;
  Ranks& ranks_;
  NodeLink* link_;
  Outcome out_;
  bool local_failed_ = false, local_done_ = false;
  std::vector<bool> nodes_done_;
};

}  // namespace

int launch(const Options& o) {
  std::string dir = std::filesystem::temp_directory_path().string() + "/kiln-run-XXXXXX";
  if (!::mkdtemp(dir.data())) {
    std::fprintf(stderr, "kiln-run: error: cannot make a directory like %s: %s\n", dir.c_str(), std::strerror(errno));
    return 1;
  }
  // Signals arrive on a signalfd; the ranks get the old mask back.
  sigset_t wanted, old;
  sigemptyset(&wanted);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&wanted, s);
  ::sigprocmask(SIG_BLOCK, &wanted, &old);
  const int signal_fd = ::signalfd(-1, &wanted, SFD_CLOEXEC | SFD_NONBLOCK);
  Reaper reaper(dir);
  Ranks ranks(reaper, o.grace_s);
  std::optional<NodeLink> link;
  if (o.nnodes > 1) link.emplace(o);

  int code = 0;
  for (int restart = 0;; ++restart) {
    if (link) {
      try {
        link->join(restart, signal_fd);
      } catch (const NodeError& e) {
        std::fprintf(stderr, "kiln-run: error: %s\n", e.text.c_str());
        code = e.code;
        break;
      }
    }
    // One node shares the id through a file, a fresh one per start; several nodes use TCP.
    std::string id_file;
    if (o.nnodes == 1) id_file = dir + "/nccl-id." + std::to_string(restart);
    std::vector<std::vector<std::string>> envs;
    for (int local = 0; local < o.nproc; ++local) envs.push_back(rank_environment(o, local, restart, id_file));
    ranks.start(o.program, envs, old);
    const Outcome out = Round(o, ranks, link ? &*link : nullptr).run(signal_fd);
    // An interrupted job did not succeed, even when every rank exited cleanly on the signal.
    code = out.failure ? out.failure->code : out.abort_code ? *out.abort_code : out.signal ? 128 + out.signal : 0;
    if (out.failure && !out.abort_code && !out.signal && restart < o.max_restarts) {
      std::fprintf(stderr, "kiln-run: rank %d %s; restarting all ranks (restart %d of %d)\n", out.failure->rank,
                   out.failure->how.c_str(), restart + 1, o.max_restarts);
      continue;
    }
    break;
  }
  reaper.done();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  ::close(signal_fd);
  return code;
}

}  // namespace kiln_run
