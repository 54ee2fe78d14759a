// bench_gemm: --help, bad arguments refused before anything is measured, and without a GPU exit
// 77 saying so; with one, a short run writes a JSON row per product with kiln's, the replayed
// graph's and cuBLASLt's times.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "process.h"
#include "temp_dir.h"

using kiln_test::ProcessResult;
using kiln_test::run_process;

namespace {

ProcessResult bench_gemm(std::vector<std::string> args) {
  args.insert(args.begin(), KILN_BENCH_GEMM_PATH);
  return run_process(args);
}

}  // namespace

TEST_CASE("bench_gemm: --help, bad arguments, and a short run (or exit 77 without a GPU)") {
  if (std::string(KILN_BENCH_GEMM_PATH).empty()) {
    MESSAGE("skipped: built without the benchmarks");
    return;
  }
  const ProcessResult help = bench_gemm({"--help"});
  CHECK(help.exit_code == 0);
  for (const char* option : {"--rows", "--precision", "--algos", "--json"}) CHECK(help.out.find(option) != std::string::npos);
  for (const std::vector<std::string>& bad : std::vector<std::vector<std::string>>{
           {"--precision", "f64"}, {"--rows", "diagonal"}, {"--reps", "0"}, {"--no-such-flag"}}) {
    CAPTURE(bad.front());
    const ProcessResult r = bench_gemm(bad);
    CHECK(r.exit_code != 0);
    CHECK(r.exit_code != 77);
    CHECK((r.err + r.out).find(bad.front()) != std::string::npos);
  }
  kiln_test::TempDir tmp;
  const std::string json = tmp.file("gemm.json");
  const ProcessResult r = bench_gemm({"--rows", "training", "--precision", "bf16", "--reps", "1", "--calls", "1",
                                      "--algos", "2", "--json", json});
  if (r.exit_code == 77) {
    CHECK(r.out.find("bench_gemm: no GPU") == 0);
    return;
  }
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  std::ifstream in(json);
  std::string line;
  REQUIRE(std::getline(in, line));
  const nlohmann::json j = nlohmann::json::parse(line);
  CHECK(j["bench"] == "kiln_gemm");
  REQUIRE(j["rows"].size() == 27);  // 9 layers of batch x model, three products each
  for (const nlohmann::json& row : j["rows"]) {
    CHECK(row["precision"] == "bf16");
    CHECK(row["kiln_us"].get<double>() > 0);
    CHECK(row["graph_us"].get<double>() > 0);
    CHECK(row["lt_best_us"].get<double>() > 0);
  }
}
