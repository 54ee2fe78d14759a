// kiln-run on one node: each rank's environment, a failed rank stopping the others (SIGTERM, then
// SIGKILL after the grace period), signals passed on, --version, --help and bad arguments.
// test_kiln_run_faults.cpp: orphans, stopped ranks, restarts; test_kiln_run_nodes.cpp: several nodes.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "kiln_run_support.h"

using kiln_test::ProcessResult;
using kiln_test::run_process;
using namespace kiln_run_test;

namespace {

// Every rank but one appends to `ready` when it is set up; the odd one waits for them first.
const char* kWaitForOthers =
    "while [ \"$(wc -l < \"$1\" 2>/dev/null || echo 0)\" -lt $((WORLD_SIZE - 1)) ]; do sleep 0.02; done\n";

}  // namespace

TEST_CASE("kiln-run -n 3: each rank sees RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT, KILN_DIST_ID_FILE") {
  const ProcessResult r = kiln_run({"-n", "3", "sh", "-c",
                                    "echo $RANK $LOCAL_RANK $WORLD_SIZE $MASTER_ADDR $MASTER_PORT $KILN_DIST_ID_FILE "
                                    "$LOCAL_WORLD_SIZE $GROUP_RANK $KILN_RESTART_COUNT $TORCHELASTIC_RESTART_COUNT"});
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  std::vector<std::string> lines = lines_of(r.out);
  std::sort(lines.begin(), lines.end());
  REQUIRE(lines.size() == 3);
  std::string port, id_file;
  for (int rank = 0; rank < 3; ++rank) {
    std::istringstream in(lines[static_cast<std::size_t>(rank)]);
    int rk = -1, local = -1, world = -1, local_world = -1, group = -1, restart = -1, torch_restart = -1;
    std::string addr, p, file;
    in >> rk >> local >> world >> addr >> p >> file >> local_world >> group >> restart >> torch_restart;
    CHECK(local_world == 3);
    CHECK(group == 0);
    CHECK(restart == 0);
    CHECK(torch_restart == 0);
    CHECK(rk == rank);
    CHECK(local == rank);
    CHECK(world == 3);
    CHECK(addr == "127.0.0.1");
    CHECK(std::stoi(p) > 0);
    if (rank == 0) port = p, id_file = file;
    CHECK(p == port);  // one rendezvous for all
    CHECK(file == id_file);
  }
  CHECK(id_file.find("kiln-run-") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(std::filesystem::path(id_file).parent_path()));  // removed at the end

  for (const char* flag : {"--port", "--master-port"}) {
    const ProcessResult fixed =
        kiln_run({"--nproc-per-node", "1", flag, "29555", "--", "sh", "-c", "echo $MASTER_PORT"});
    CHECK(fixed.exit_code == 0);
    CHECK(fixed.out == "29555\n");
  }
}

TEST_CASE("kiln-run: a rank exiting 3 makes kiln-run exit 3 and stops the sleeping ranks at once") {
  kiln_test::TempDir tmp;
  const std::string script = write_script(tmp, "rank.sh",
                                          std::string("if [ \"$RANK\" = 1 ]; then\n") + kWaitForOthers +
                                              "  exit 3\nfi\necho ready >> \"$1\"\nexec sleep 60\n");
  const auto t0 = Clock::now();
  const ProcessResult r = kiln_run({"-n", "3", "--", "sh", script, tmp.file("ready")});
  const double took = seconds_since(t0);
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 3);
  CHECK(took < 8);  // SIGTERM ends the sleeps: far under their 60 s and under the 10 s grace
  CHECK(r.err.find("kiln-run: rank 1 (pid ") != std::string::npos);
  CHECK(r.err.find("exited with code 3; stopping the other ranks") != std::string::npos);
  CHECK(r.err.find("SIGKILL") == std::string::npos);
}

TEST_CASE("kiln-run: ranks that ignore SIGTERM get SIGKILL after --grace; a killed rank exits 128+signal") {
  kiln_test::TempDir tmp;
  const std::string stubborn = write_script(tmp, "stubborn.sh",
                                            std::string("if [ \"$RANK\" = 0 ]; then\n") + kWaitForOthers +
                                                "  exit 5\nfi\ntrap '' TERM\necho ready >> \"$1\"\nsleep 60\n");
  auto t0 = Clock::now();
  ProcessResult r = kiln_run({"-n", "3", "--grace", "0.5", "--", "sh", stubborn, tmp.file("ready")});
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 5);
  CHECK(seconds_since(t0) < 8);
  CHECK(r.err.find("2 rank(s) still running 0.5 s after SIGTERM; sending SIGKILL") != std::string::npos);

  t0 = Clock::now();
  r = kiln_run({"-n", "2", "--", "sh", "-c", "if [ $RANK = 1 ]; then kill -9 $$; fi; exec sleep 60"});
  CHECK(r.exit_code == 128 + 9);
  CHECK(seconds_since(t0) < 8);
  CHECK(r.err.find("rank 1 (pid ") != std::string::npos);
  CHECK(r.err.find("was killed by signal 9") != std::string::npos);
}

TEST_CASE("kiln-run passes SIGTERM to the ranks and exits 128+15 even when they exit cleanly") {
  kiln_test::TempDir tmp;
  const std::string rank = write_script(tmp, "rank.sh",
                                        "trap 'echo \"rank $RANK got TERM\"; exit 0' TERM\n"
                                        "echo ready >> \"$1\"\nsleep 60 & wait\n");
  const std::string driver =
      write_script(tmp, "driver.sh",
                   "\"$1\" -n 2 -- sh \"$2\" \"$3\" &\nk=$!\n"
                   "while [ \"$(wc -l < \"$3\" 2>/dev/null || echo 0)\" -lt 2 ]; do sleep 0.02; done\n"
                   "kill -TERM $k\nwait $k\necho \"kiln-run exit $?\"\n");
  const auto t0 = Clock::now();
  const ProcessResult r = run_process({"/bin/sh", driver, KILN_RUN_PATH, rank, tmp.file("ready")});
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(seconds_since(t0) < 8);
  CHECK(r.out.find("rank 0 got TERM") != std::string::npos);
  CHECK(r.out.find("rank 1 got TERM") != std::string::npos);
  CHECK(r.out.find("kiln-run exit 143") != std::string::npos);
}

TEST_CASE("kiln-run --version, --help; -n outside 1-64, a missing program or a bad option are CLI errors") {
  const ProcessResult v = kiln_run({"--version"});
  CHECK(v.exit_code == 0);
  CHECK(v.out.rfind("kiln ", 0) == 0);
  CHECK(v.out.find("\nNCCL ") != std::string::npos);

  for (const char* n : {"0", "65", "-3", "two"}) {
    CAPTURE(n);
    const ProcessResult r = kiln_run({"-n", n, "true"});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("kiln-run: error: --nproc") == 0);
  }
  ProcessResult r = kiln_run({"-n", "2"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("kiln-run: error: no program to run") == 0);
  r = kiln_run({"-n", "2", "--"});
  CHECK(r.exit_code == 2);
  r = kiln_run({"true"});  // -n is required
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--nproc") != std::string::npos);
  r = kiln_run({"-n", "1", "--nnodes", "2", "--node-rank", "2", "true"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("kiln-run: error: --node-rank 2 is not below --nnodes 2") == 0);
  r = kiln_run({"-n", "1", "--nnodes", "2", "true"},
               {{"KILN_DIST_TIMEOUT_S", "soon"}});  // the launchers' wait comes from it
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("KILN_DIST_TIMEOUT_S='soon'") != std::string::npos);
  r = kiln_run({"--help"});
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("SIGKILL when stopping the ranks (default 10)") != std::string::npos);
  CHECK(r.out.find("--max-restarts") != std::string::npos);
  CHECK(r.out.find("PORT+1") != std::string::npos);
  r = kiln_run({"-n", "1", "/nonexistent/program"});
  CHECK(r.exit_code == 127);
  CHECK(r.err.find("kiln-run: cannot run /nonexistent/program: No such file or directory") != std::string::npos);
}
