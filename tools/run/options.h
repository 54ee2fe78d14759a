#pragma once
// kiln-run's settings, as parsed from the command line (main.cpp).
#include <string>
#include <vector>

namespace kiln_run {

// 2: the command line is wrong, or the launchers of several nodes could not agree (disagreeing
// flags, a node rank twice, the master unreachable within --rdzv-timeout).
constexpr int kUsageExit = 2;

struct Options {
  int nproc = 0;                  // ranks on this node
  int nnodes = 1, node_rank = 0;  // machines, and which one this is
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port (one node) or 29500 (several)
  int max_restarts = 0;
  double grace_s = 10;          // SIGTERM to SIGKILL
  double rdzv_timeout_s = 300;  // several nodes: how long the launchers wait for each other
  std::vector<std::string> program;

  int world_size() const { return nnodes * nproc; }
  int global_rank(int local) const { return node_rank * nproc + local; }
  // The ranks' own NCCL-id rendezvous; with several nodes the launchers take master_port itself.
  int ranks_port() const { return nnodes > 1 ? master_port + 1 : master_port; }
};

// Starts the ranks (again after a failure, up to max_restarts times) and returns kiln-run's exit code.
int launch(const Options& options);

}  // namespace kiln_run
