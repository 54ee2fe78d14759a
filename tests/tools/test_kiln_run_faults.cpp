// kiln-run's faults on one node: killed by SIGKILL (no rank, child of a rank or temp folder left
// within 2 s), a SIGSTOPped rank beside a failing one, and --max-restarts.
#include <doctest/doctest.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "kiln_run_support.h"

using kiln_test::Process;
using kiln_test::ProcessResult;
using namespace kiln_run_test;

namespace {

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("kiln-run killed by SIGKILL: its ranks, their children and a rank that ignores SIGTERM are gone within 2 s") {
  kiln_test::TempDir tmp;
  // Rank 0 runs a grandchild shell with a sleep of its own (PDEATHSIG would reach only rank 0's sh);
  // rank 1 ignores SIGTERM, and so does its sleep. Each appends the pids it makes to $1.
  const std::string script =
      write_script(tmp, "rank.sh",
                   "echo $$ >> \"$1\"\n"
                   "dirname \"$KILN_DIST_ID_FILE\" > \"$1.dir\"\n"
                   "if [ \"$RANK\" = 0 ]; then\n"
                   "  sh -c 'echo $$ >> \"$1\"; sleep 100 & echo $! >> \"$1\"; wait; true' sh \"$1\"\n"
                   "else\n"
                   "  trap '' TERM; sleep 100 & echo $! >> \"$1\"; wait\n"
                   "fi\n");
  const std::string pid_file = tmp.file("pids");
  Process launcher({KILN_RUN_PATH, "-n", "2", "--", "sh", script, pid_file});
  const std::vector<std::string> lines = wait_for_lines(pid_file, 5);
  REQUIRE(lines.size() == 5);
  std::vector<pid_t> pids;
  for (const std::string& l : lines) pids.push_back(static_cast<pid_t>(std::stoi(l)));
  const std::string dir = wait_for_lines(pid_file + ".dir", 1).at(0);
  CHECK(dir.find("kiln-run-") != std::string::npos);
  CHECK(std::filesystem::exists(dir));
  for (pid_t p : pids) CHECK(alive(p));

  REQUIRE(::kill(launcher.pid(), SIGKILL) == 0);
  const auto t0 = Clock::now();
  while (seconds_since(t0) < 10 && (std::any_of(pids.begin(), pids.end(), alive) || std::filesystem::exists(dir)))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const double gone_after = seconds_since(t0);
  const ProcessResult r = launcher.wait();
  for (pid_t p : pids)
    if (alive(p)) ::kill(p, SIGKILL);  // a failed run leaves nothing behind either
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 128 + SIGKILL);
  CHECK(gone_after < 2.0);
  CHECK_FALSE(std::filesystem::exists(dir));
  CHECK(r.err.find("kiln-run (reaper): kiln-run died; stopping 2 rank(s)") != std::string::npos);
}

TEST_CASE("kiln-run: a SIGSTOPped rank beside a failing one; SIGCONT follows SIGTERM, SIGKILL after --grace") {
  kiln_test::TempDir tmp;
  // Rank 0 stops itself (ignoring SIGTERM when $2 says so); rank 1 fails once rank 0 is stopped,
  // noting when (wall-clock seconds) in $1.failed.
  const std::string script =
      write_script(tmp, "rank.sh",
                   "if [ \"$RANK\" = 0 ]; then\n"
                   "  [ \"$2\" = ignore ] && trap '' TERM\n"
                   "  echo $$ > \"$1\"; kill -STOP $$; exec sleep 60\n"
                   "fi\n"
                   "while [ ! -s \"$1\" ]; do sleep 0.02; done\n"
                   "while [ \"$(cut -d' ' -f3 /proc/$(cat \"$1\")/stat)\" != T ]; do sleep 0.02; done\n"
                   "date +%s.%N > \"$1.failed\"; exit 4\n");
  // Seconds from rank 1's failure to kiln-run's exit.
  auto since_failure = [&] {
    const double failed_at = std::stod(wait_for_lines(tmp.file("pid0.failed"), 1).at(0));
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() - failed_at;
  };
  // SIGTERM alone would wait in a stopped process until SIGKILL; with SIGCONT it ends it at once.
  ProcessResult r = kiln_run({"-n", "2", "--grace", "8", "--", "sh", script, tmp.file("pid0"), "default"});
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 4);
  CHECK(since_failure() < 4);
  CHECK(r.err.find("SIGKILL") == std::string::npos);

  // A stopped rank that ignores SIGTERM ends by SIGKILL after the grace period.
  std::filesystem::remove(tmp.file("pid0"));
  r = kiln_run({"-n", "2", "--grace", "2", "--", "sh", script, tmp.file("pid0"), "ignore"});
  const double took = since_failure();
  CHECK(r.exit_code == 4);
  CHECK(took >= 1.9);
  // The promise is grace + 1 s (2.1-2.3 s measured here); 2 s more for a loaded 2-core CI machine,
  // where two copies of this suite once stalled kiln-run 2.8 s.
  CHECK(took < 2 + 1 + 2);
  CHECK(r.err.find("1 rank(s) still running 2 s after SIGTERM; sending SIGKILL") != std::string::npos);
}

TEST_CASE("kiln-run --max-restarts: a rank failing once is restarted with KILN_RESTART_COUNT; without, exit 3") {
  // Rank 1 fails on the first start only; every start prints its count and its id file.
  const std::string program =
      "echo \"run $KILN_RESTART_COUNT $TORCHELASTIC_RESTART_COUNT rank $RANK $KILN_DIST_ID_FILE\"; "
      "if [ $RANK = 1 ] && [ $KILN_RESTART_COUNT = 0 ]; then exit 3; fi";
  ProcessResult r = kiln_run({"-n", "2", "--max-restarts", "1", "--", "sh", "-c", program});
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.err.find("kiln-run: rank 1 exited with code 3; restarting all ranks (restart 1 of 1)\n") !=
        std::string::npos);
  CHECK(count_of(r.out, "run 1 1 rank 0 ") == 1);
  CHECK(count_of(r.out, "run 1 1 rank 1 ") == 1);
  CHECK(r.out.find("nccl-id.0") != std::string::npos);
  CHECK(r.out.find("nccl-id.1") != std::string::npos);  // a fresh rendezvous per start

  r = kiln_run({"-n", "2", "--", "sh", "-c", program});
  CHECK(r.exit_code == 3);
  CHECK(r.err.find("restarting") == std::string::npos);
  CHECK(count_of(r.out, "run 1 1") == 0);
}

TEST_CASE("kiln-run --max-restarts 2: a rank that always fails runs 3 times, then kiln-run exits with its code") {
  const ProcessResult r =
      kiln_run({"-n", "2", "--max-restarts", "2", "--", "sh", "-c",
                "if [ $RANK = 1 ]; then echo \"rank 1 run $KILN_RESTART_COUNT\"; exit 3; fi; exec sleep 60"});
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.exit_code == 3);
  CHECK(lines_of(r.out) == std::vector<std::string>{"rank 1 run 0", "rank 1 run 1", "rank 1 run 2"});
  CHECK(r.err.find("(restart 1 of 2)") != std::string::npos);
  CHECK(r.err.find("(restart 2 of 2)") != std::string::npos);
  CHECK(count_of(r.err, "restarting all ranks") == 2);
}

TEST_CASE("kiln-run --max-restarts: a signal to kiln-run never restarts") {
  kiln_test::TempDir tmp;
  const std::string script = write_script(tmp, "rank.sh",
                                          "trap 'exit 7' TERM\n"
                                          "echo \"start $KILN_RESTART_COUNT\" >> \"$1\"\n"
                                          "sleep 60 & wait\n");
  Process launcher({KILN_RUN_PATH, "-n", "2", "--max-restarts", "3", "--", "sh", script, tmp.file("started")});
  REQUIRE(wait_for_lines(tmp.file("started"), 2).size() == 2);
  REQUIRE(::kill(launcher.pid(), SIGTERM) == 0);
  const ProcessResult r = launcher.wait();
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 7);  // the ranks' code: they failed, on the signal
  CHECK(r.err.find("got Terminated; passing it to the ranks") != std::string::npos);
  CHECK(r.err.find("restarting") == std::string::npos);
  CHECK(wait_for_lines(tmp.file("started"), 3, std::chrono::seconds(0)).size() == 2);
}
