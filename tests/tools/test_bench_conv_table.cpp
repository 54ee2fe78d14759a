// tools/bench/bench_conv_torch.py --cudnn: an earlier cuDNN run set beside a bench_conv run and
// tabulated for the README, measuring nothing (so without torch or a GPU), as replayed graphs
// where both runs timed them, else launched one by one; what it cannot read is named.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "process.h"
#include "temp_dir.h"

using kiln_test::ProcessResult;

namespace {

ProcessResult conv_table(std::vector<std::string> args) {
  args.insert(args.begin(), {"/usr/bin/env", "python3", std::string(KILN_SOURCE_DIR) + "/tools/bench/bench_conv_torch.py"});
  return kiln_test::run_process(args);
}

// One row per op of a 3x3 conv, `us` microseconds each launched one by one and `graph` as
// replayed graphs (none: a run from before graphs were timed); `bench` names the tool.
std::string json_line(const std::string& bench, const std::vector<double>& us, const std::vector<double>& graph = {}) {
  const char* ops[] = {"conv2d", "conv2d_grad_input", "conv2d_grad_weight"};
  std::string rows;
  for (std::size_t i = 0; i < us.size(); ++i)
    rows += std::string(i ? "," : "") + R"({"name":"res","shape":"8,16,12,12,16,3,3,1,1","precision":"bf16","op":")" +
            ops[i] + R"(","us":)" + std::to_string(us[i]) +
            (graph.empty() ? std::string() : R"(,"graph_us":)" + std::to_string(graph[i])) +
            R"(,"tflops":1.0,"first_ms":)" + std::to_string(100.0 * (i + 1)) + R"(,"note":""})";
  return R"({"bench":")" + bench + R"(","device":"test GPU","rows":[)" + rows + "]}\n";
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("bench_conv_torch.py --cudnn: an earlier run's table and ratios without measuring; bad input named") {
  if (std::system("python3 -c 'import json' >/dev/null 2>&1") != 0) {
    MESSAGE("skipped: no python3");
    return;
  }
  kiln_test::TempDir dir;
  const std::string kiln = (dir.path() / "kiln.json").string(), cudnn = (dir.path() / "cudnn.txt").string();
  const std::string table = (dir.path() / "table.md").string();
  std::ofstream(kiln) << json_line("kiln_conv", {10, 40, 30});
  std::ofstream(cudnn) << "a line of its table\n" << json_line("torch_conv", {20, 20, 30});
  const ProcessResult r = conv_table({"--kiln", kiln, "--cudnn", cudnn, "--markdown", table});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("kiln reaches cuDNN's throughput on 2 of 3 rows launched one by one") != std::string::npos);
  CHECK(r.out.find("rows as replayed graphs") == std::string::npos);  // neither run timed graphs
  CHECK(r.out.find("below cuDNN") != std::string::npos);  // the input gradient: 40 against 20 us
  const std::string md = slurp(table);
  CHECK(md.find("| res 16\u219216 3x3, 8x12\u00b2 | forward | 10.0 / 20.0 (2.00x) | n/a | n/a |") != std::string::npos);
  CHECK(md.find("| input grad | 40.0 / 20.0 (0.50x) |") != std::string::npos);
  CHECK(md.find("first calls: 200 ms on average, at most 300 ms, 0 of 3 over 1 s") != std::string::npos);

  // Both runs with graphs: the graphs decide the count and the table (eager: 2.00, 0.50, 1.00;
  // graphs: 2.00, 0.83, 0.75).
  std::ofstream(kiln) << json_line("kiln_conv", {10, 40, 30}, {9, 30, 20});
  std::ofstream(cudnn) << json_line("torch_conv", {20, 20, 30}, {18, 25, 15});
  const ProcessResult g = conv_table({"--kiln", kiln, "--cudnn", cudnn, "--markdown", table});
  INFO(g.out << g.err);
  REQUIRE(g.exit_code == 0);
  CHECK(g.out.find("kiln reaches cuDNN's throughput on 2 of 3 rows launched one by one") != std::string::npos);
  CHECK(g.out.find("kiln reaches cuDNN's throughput on 1 of 3 rows as replayed graphs") != std::string::npos);
  const std::string gmd = slurp(table);
  CHECK(gmd.find("| forward | 9.0 / 18.0 (2.00x) | n/a | n/a |") != std::string::npos);
  CHECK(gmd.find("| weight grad | 20.0 / 15.0 (0.75x) |") != std::string::npos);

  // The cuDNN file must hold this script's JSON line; --cudnn and --markdown need --kiln.
  const ProcessResult wrong = conv_table({"--kiln", kiln, "--cudnn", kiln});
  CHECK(wrong.exit_code == 2);
  CHECK(wrong.err.find(kiln + " holds no bench_conv_torch JSON line") != std::string::npos);
  const ProcessResult alone = conv_table({"--cudnn", cudnn});
  CHECK(alone.exit_code == 2);
  CHECK(alone.err.find("--markdown and --cudnn need --kiln") != std::string::npos);
}
