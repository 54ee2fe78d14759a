// kiln-run across nodes, as two launchers on this machine with the master on 127.0.0.2 (another
// loopback address; nothing leaves the machine): the ranks' variables, the library's TCP id
// exchange between nodes, nodes that disagree, an unreachable master, restarts in step and a lost
// master.
#include <doctest/doctest.h>
#include <signal.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "kiln_run_support.h"

using kiln_test::Process;
using kiln_test::ProcessResult;
using namespace kiln_run_test;

namespace {

// kiln-run's arguments for node `node` of `nnodes`, master 127.0.0.2:port, then the program.
std::vector<std::string> node_args(int nnodes, int node, int nproc, int port, std::vector<std::string> more) {
  std::vector<std::string> a = {KILN_RUN_PATH,         "--nnodes",           std::to_string(nnodes),
                                "--node-rank",         std::to_string(node), "-n",
                                std::to_string(nproc), "--master-addr",      "127.0.0.2",
                                "--master-port",       std::to_string(port)};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// Runs both nodes at once and returns {node 0, node 1}.
std::vector<ProcessResult> two_nodes(int nproc, const std::vector<std::string>& more,
                                     const kiln_test::EnvOverrides& env = {}) {
  const int port = free_port_pair("127.0.0.2");
  REQUIRE(port > 0);
  Process n0(node_args(2, 0, nproc, port, more), env), n1(node_args(2, 1, nproc, port, more), env);
  ProcessResult r1 = n1.wait(), r0 = n0.wait();
  return {r0, r1};
}

}  // namespace

TEST_CASE("kiln-run --nnodes 2: RANK, LOCAL_RANK, WORLD_SIZE = nodes x ranks, MASTER_PORT+1, no id file") {
  const int port = free_port_pair("127.0.0.2");
  REQUIRE(port > 0);
  const std::vector<std::string> program = {
      "--", "sh", "-c",
      "echo $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $MASTER_PORT "
      "${KILN_DIST_ID_FILE-none}"};
  // A KILN_DIST_ID_FILE in kiln-run's own environment would send the ranks to a file no other node sees.
  const kiln_test::EnvOverrides env = {{"KILN_DIST_ID_FILE", "/tmp/stale-id"}};
  Process n0(node_args(2, 0, 2, port, program), env), n1(node_args(2, 1, 2, port, program), env);
  const ProcessResult r1 = n1.wait(), r0 = n0.wait();
  INFO("node 0: " << r0.out << r0.err << "\nnode 1: " << r1.out << r1.err);
  REQUIRE(r0.exit_code == 0);
  REQUIRE(r1.exit_code == 0);
  for (int node = 0; node < 2; ++node) {
    std::vector<std::string> lines = lines_of(node == 0 ? r0.out : r1.out);
    std::sort(lines.begin(), lines.end());
    REQUIRE(lines.size() == 2);
    for (int local = 0; local < 2; ++local) {
      const std::string expected = std::to_string(node * 2 + local) + " " + std::to_string(local) + " 4 2 " +
                                   std::to_string(node) + " 127.0.0.2 " + std::to_string(port + 1) + " none";
      CHECK(lines[static_cast<std::size_t>(local)] == expected);
    }
  }
}

TEST_CASE("kiln-run --nnodes 2: the ranks of both nodes get rank 0's id through the library's TCP rendezvous") {
  const std::vector<ProcessResult> r =
      two_nodes(2, {"--", KILN_TEST_HELPER_PATH, "dist-rendezvous"}, {{"KILN_DIST_TIMEOUT_S", "60"}});
  INFO("node 0: " << r[0].out << r[0].err << "\nnode 1: " << r[1].out << r[1].err);
  REQUIRE(r[0].exit_code == 0);
  REQUIRE(r[1].exit_code == 0);
  std::vector<std::string> lines = lines_of(r[0].out + r[1].out);
  std::sort(lines.begin(), lines.end());
  REQUIRE(lines.size() == 4);
  const std::string id = lines[0].substr(lines[0].find(" id ") + 4);
  CHECK(id.size() == 16);
  CHECK(id != "0000000000000000");  // rank 0's random id, not the zeros the others start with
  for (int rank = 0; rank < 4; ++rank)
    CHECK(lines[static_cast<std::size_t>(rank)] == "rank " + std::to_string(rank) + " id " + id);
}

TEST_CASE("kiln-run nodes that disagree: every kiln-run prints the same error and exits 2") {
  const int port = free_port_pair("127.0.0.2");
  REQUIRE(port > 0);
  {
    Process n0(node_args(2, 0, 1, port, {"true"})), n1(node_args(3, 1, 1, port, {"true"}));
    const ProcessResult r1 = n1.wait(), r0 = n0.wait();
    for (const ProcessResult& r : {r0, r1}) {
      CHECK(r.exit_code == 2);
      CHECK(r.err == "kiln-run: error: node 1 says --nnodes 3, node 0 says 2\n");
    }
  }
  {
    Process n0(node_args(2, 0, 1, port, {"true"})), n1(node_args(2, 1, 2, port, {"true"}));
    const ProcessResult r1 = n1.wait(), r0 = n0.wait();
    for (const ProcessResult& r : {r0, r1}) {
      CHECK(r.exit_code == 2);
      CHECK(r.err == "kiln-run: error: node 1 says --nproc-per-node 2, node 0 says 1\n");
    }
  }
  {
    // Three nodes, node rank 1 twice: the second one is refused, and the job with it.
    Process n0(node_args(3, 0, 1, port, {"true"})), n1(node_args(3, 1, 1, port, {"true"}));
    Process again(node_args(3, 1, 1, port, {"true"}));
    for (Process* p : {&n0, &n1, &again}) {
      const ProcessResult r = p->wait();
      CHECK(r.exit_code == 2);
      CHECK(r.err == "kiln-run: error: node rank 1 joined twice\n");
    }
  }
}

TEST_CASE("kiln-run: an unreachable master is a clear error after --rdzv-timeout (or $KILN_DIST_TIMEOUT_S)") {
  const int port = free_port_pair("127.0.0.3");  // nobody listens there
  REQUIRE(port > 0);
  const std::string expected = "kiln-run: error: cannot reach the master 127.0.0.3:" + std::to_string(port) +
                               " within 1 s (is node 0's kiln-run started? is the port open?)";
  for (bool flag : {true, false}) {
    CAPTURE(flag);
    std::vector<std::string> args = {
        KILN_RUN_PATH,   "--nnodes",          "2", "--node-rank", "1", "-n", "1", "--master-addr", "127.0.0.3",
        "--master-port", std::to_string(port)};
    if (flag) args.insert(args.end(), {"--rdzv-timeout", "1"});
    args.push_back("true");
    const auto t0 = Clock::now();
    const ProcessResult r = kiln_test::run_process(args, {{"KILN_DIST_TIMEOUT_S", flag ? "600" : "1"}});
    const double took = seconds_since(t0);
    CHECK(r.exit_code == 2);
    CHECK(took >= 1);
    CHECK(took < 1 + 5);  // about 1.3 s; starting kiln-run (libkiln) can take seconds on a loaded machine
    CHECK(r.err.find(expected) == 0);
  }
}

TEST_CASE("kiln-run --nnodes 2 --max-restarts 1: a rank of node 1 failing restarts the ranks of both nodes") {
  const std::string program =
      "echo \"run $KILN_RESTART_COUNT rank $RANK\"; "
      "if [ $RANK = 1 ] && [ $KILN_RESTART_COUNT = 0 ]; then exit 3; fi; sleep 0.2";
  std::vector<ProcessResult> r = two_nodes(1, {"--max-restarts", "1", "--", "sh", "-c", program});
  INFO("node 0: " << r[0].out << r[0].err << "\nnode 1: " << r[1].out << r[1].err);
  for (int node = 0; node < 2; ++node) {
    CHECK(r[static_cast<std::size_t>(node)].exit_code == 0);
    CHECK(r[static_cast<std::size_t>(node)].err.find(
              "kiln-run: rank 1 exited with code 3; restarting all ranks (restart 1 of 1)") != std::string::npos);
    CHECK(r[static_cast<std::size_t>(node)].out.find("run 1 rank " + std::to_string(node)) != std::string::npos);
  }
  CHECK(r[0].err.find("kiln-run: rank 1 (on node 1) exited with code 3; stopping the ranks") != std::string::npos);

  r = two_nodes(1, {"--", "sh", "-c", program});
  for (const ProcessResult& one : r) {
    CHECK(one.exit_code == 3);
    CHECK(one.err.find("restarting") == std::string::npos);
  }
}

TEST_CASE("kiln-run --nnodes 2: when node 0's kiln-run dies, node 1 stops its ranks and exits 1") {
  const int port = free_port_pair("127.0.0.2");
  REQUIRE(port > 0);
  kiln_test::TempDir tmp;
  const std::string script = write_script(tmp, "rank.sh", "echo $RANK >> \"$1\"\nexec sleep 60\n");
  Process n0(node_args(2, 0, 1, port, {"sh", script, tmp.file("started")}));
  Process n1(node_args(2, 1, 1, port, {"sh", script, tmp.file("started")}));
  REQUIRE(wait_for_lines(tmp.file("started"), 2).size() == 2);
  REQUIRE(::kill(n0.pid(), SIGKILL) == 0);
  const auto t0 = Clock::now();
  const ProcessResult r1 = n1.wait();
  INFO("node 1: " << r1.err);
  CHECK(r1.exit_code == 1);
  CHECK(seconds_since(t0) < 8);
  CHECK(r1.err.find("kiln-run: error: lost the connection to the master 127.0.0.2:" + std::to_string(port)) !=
        std::string::npos);
  CHECK(n0.wait().exit_code == 128 + SIGKILL);
}
