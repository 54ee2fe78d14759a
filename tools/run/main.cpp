// kiln-run: starts N processes of one program for kiln::dist, one per GPU, as torchrun does, on
// one machine or several (--nnodes). When a rank fails the others are stopped (SIGTERM, SIGKILL
// after --grace), on every node, and kiln-run restarts them all (--max-restarts) or exits with the
// failed rank's code (128 + signal when killed), so a job never hangs on a dead peer.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tcp.h"
#include "kiln/dist.h"
#include "kiln/error.h"
#include "options.h"
#include "version_text.h"

namespace {

using kiln_run::kUsageExit;

int usage_error(const std::string& message) {
  std::fprintf(stderr, "kiln-run: error: %s (run 'kiln-run --help')\n", message.c_str());
  return kUsageExit;
}

// Where kiln-run's options end and the program begins: at "--", or at the first word that is
// neither an option nor an option's value ("kiln-run -n 2 sh -c ...": -c is the program's).
int program_start(int argc, char** argv) {
  const std::vector<std::string> with_value = {
      "-n",          "--nproc",       "--nproc-per-node", "--port",         "--grace",       "--nnodes",
      "--node-rank", "--master-addr", "--master-port",    "--max-restarts", "--rdzv-timeout"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") return i;
    if (a.empty() || a[0] != '-') return i;
    for (const std::string& v : with_value) i += a == v ? 1 : 0;
  }
  return argc;
}

const char* kFooter =
    "Usage: kiln-run -n N [options] [--] program args...\n"
    "Each rank gets RANK (node rank x N + LOCAL_RANK), LOCAL_RANK, WORLD_SIZE (nodes x N),\n"
    "LOCAL_WORLD_SIZE, GROUP_RANK (node rank), MASTER_ADDR, MASTER_PORT, KILN_RESTART_COUNT and\n"
    "TORCHELASTIC_RESTART_COUNT; on one node also KILN_DIST_ID_FILE. kiln::dist::ProcessGroup::init()\n"
    "reads them. Several nodes: run kiln-run on each with the same --nnodes, -n, --master-addr,\n"
    "--master-port and --max-restarts and its own --node-rank; node 0's kiln-run listens on PORT,\n"
    "and its rank 0 on PORT+1 for the NCCL id. If kiln-run is killed, even by SIGKILL, its ranks are\n"
    "stopped within 2 s. Exit code: the failed rank's (128 + signal when killed by one), 128 + signal\n"
    "when kiln-run was interrupted, 2 for a bad command line, nodes that do not agree or a master\n"
    "not reached within --rdzv-timeout, 1 when the nodes lose one another's kiln-run.";

}  // namespace

int main(int argc, char** argv) {
  kiln_run::Options o;
  std::optional<double> rdzv_timeout;
  CLI::App app{"kiln-run: run N processes of a program for kiln::dist (one per GPU), torchrun-style"};
  kiln::cli::add_version_flag(app);
  app.add_option("-n,--nproc,--nproc-per-node", o.nproc, "Processes (ranks) to start on this node, 1-64")
      ->required()
      ->check(CLI::Range(1, 64));
  app.add_option("--nnodes", o.nnodes, "Nodes (machines) of the job (default 1)")->check(CLI::Range(1, 4096));
  app.add_option("--node-rank", o.node_rank, "This node's rank, 0 to nnodes-1 (default 0)")->check(CLI::Range(0, 4095));
  app.add_option("--master-addr", o.master_addr, "Node 0's host name or address (default 127.0.0.1)");
  app.add_option("--master-port,--port", o.master_port,
                 "The rendezvous port (default: a free port on one node, 29500 on several)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--max-restarts", o.max_restarts, "Restarts of all ranks after a failure (default 0)")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--grace", o.grace_s, "Seconds between SIGTERM and SIGKILL when stopping the ranks (default 10)")
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--rdzv-timeout", rdzv_timeout,
                 "Seconds the nodes wait for each other (default $KILN_DIST_TIMEOUT_S, else 300)")
      ->check(CLI::Range(0.001, 1e9));
  app.footer(kFooter);
  const int split = program_start(argc, argv);
  try {
    app.parse(split, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    std::printf("%s\nNCCL %s\n", kiln::cli::version_text().c_str(),
                kiln::dist::nccl_available() ? kiln::dist::nccl_version().c_str() : ": not found");
    return 0;
  } catch (const CLI::ParseError& e) {
    return usage_error(e.what());
  }
  const int first = split < argc && std::strcmp(argv[split], "--") == 0 ? split + 1 : split;
  if (first >= argc) return usage_error("no program to run: kiln-run -n N [options] [--] program args...");
  o.program.assign(argv + first, argv + argc);
  if (o.node_rank >= o.nnodes)
    return usage_error("--node-rank " + std::to_string(o.node_rank) + " is not below --nnodes " +
                       std::to_string(o.nnodes));
  if (o.master_addr.empty()) return usage_error("--master-addr is empty");
  if (o.nnodes > 1 && o.master_port == 65535)
    return usage_error("--master-port 65535: several nodes use PORT and PORT+1");
  try {
    if (rdzv_timeout)
      o.rdzv_timeout_s = *rdzv_timeout;
    else if (o.nnodes > 1)
      o.rdzv_timeout_s = static_cast<double>(kiln::dist::timeout_from_environment().count()) / 1000.0;
    if (o.master_port == 0) o.master_port = o.nnodes > 1 ? 29500 : kiln::dist::detail::free_tcp_port();
  } catch (const kiln::Error& e) {
    return usage_error(e.what());
  }
  return kiln_run::launch(o);
}
