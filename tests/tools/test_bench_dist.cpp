// bench_dist without a GPU: --help, bad arguments exit 2 with a "bench_dist:" message before
// anything is measured, and --device cpu runs the rows' code path and writes their JSON lines (the
// timing itself needs two GPUs: tools/bench/bench_dist.sh). On two GPUs: the per-bucket optimizer
// steps train the weights of the optimizer after the last all-reduce, bit for bit.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kiln/dist.h"
#include "kiln/kiln.h"
#include "kiln/runtime/device.h"
#include "process.h"
#include "temp_dir.h"

using kiln_test::ProcessResult;
using kiln_test::run_process;

namespace {

ProcessResult bench_dist(std::vector<std::string> args) {
  args.insert(args.begin(), KILN_BENCH_DIST_PATH);
  return run_process(args);
}

}  // namespace

TEST_CASE("bench_dist: --help, and bad arguments exit 2 with the reason") {
  const ProcessResult help = bench_dist({"--help"});
  CHECK(help.exit_code == 0);
  CHECK(help.out.find("--model") != std::string::npos);
  CHECK(help.out.find("--grad-bf16") != std::string::npos);

  kiln_test::TempDir tmp;
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad{
      {{"--model", "resnet"}, "--model"},
      {{"--precision", "f32,f64"}, "--precision"},
      {{"--steps", "0"}, "--steps"},
      {{"--no-such-flag"}, "--no-such-flag"},
      {{"--json", tmp.file("missing-dir/rows.jsonl")}, "cannot write"},
  };
  for (const auto& row : bad) {
    const auto& args = row.first;  // not a structured binding: clang 14 cannot capture one
    const auto& what = row.second;
    CAPTURE(args.front());
    const ProcessResult r = bench_dist(args);
    CHECK(r.exit_code == 2);
    CHECK(r.err.rfind("bench_dist: ", 0) == 0);
    CHECK(r.err.find(what) != std::string::npos);
  }
  // A malformed launcher environment is a usage error too.
  const ProcessResult env = run_process({KILN_BENCH_DIST_PATH}, {{"RANK", "x"}, {"WORLD_SIZE", "2"}});
  CHECK(env.exit_code == 2);
  CHECK(env.err.find("bench_dist: [dist.env] RANK") == 0);
}

TEST_CASE("bench_dist --device cpu: one JSON line per (model, precision), appended to --json") {
  kiln_test::TempDir tmp;
  const std::string json = tmp.file("rows.jsonl");
  const std::vector<std::string> args{"--device", "cpu", "--model",   "cnn", "--precision", "f32", "--batch", "4",
                                      "--steps",  "2",   "--repeats", "2",   "--warmup",    "0",   "--json",  json};
  for (int run = 0; run < 2; ++run) {
    const ProcessResult r = bench_dist(args);
    INFO("stderr: " << r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(r.out.find("cnn      f32") != std::string::npos);
  }
  std::ifstream in(json);
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  REQUIRE(rows.size() == 2);
  const nlohmann::json& row = rows.front();
  CHECK(row["bench"] == "kiln");
  CHECK(row["model"] == "cnn");
  CHECK(row["precision"] == "f32");
  CHECK(row["world"] == 1);
  CHECK(row["ddp"] == false);
  CHECK(row["reducer"] == false);
  CHECK(row["device"] == "cpu");
  CHECK(row["windows"].size() == 2);
  CHECK(row["samples_per_s"].get<double>() > 0);
  CHECK(row["loss"].is_number());

  const ProcessResult launched =
      run_process({KILN_BENCH_DIST_PATH, "--device", "cpu"}, {{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  CHECK(launched.exit_code == 2);
  CHECK(launched.err.find("bench_dist: --device cpu runs without a launcher") == 0);
}

// GradReducer::finish(opt) updates each bucket's parameters as its all-reduce completes; the
// weights after a few compiled steps must be those of finish() then step() on every rank.
TEST_CASE("bench_dist on two GPUs: per-bucket optimizer steps give the weights of a step after the last bucket") {
  std::string why;
  if (!kiln::rt::gpu_available(&why) || !kiln::dist::nccl_available(&why) || kiln::cuda_device_count() < 2) {
    MESSAGE("skipped: needs two GPUs and NCCL");
    return;
  }
  kiln_test::TempDir tmp;
  const std::string json = tmp.file("rows.jsonl");
  for (const bool after_all : {false, true}) {
    std::vector<std::string> args{KILN_RUN_PATH, "-n",      "2",           "--",        KILN_BENCH_DIST_PATH,
                                  "--model",     "mlp4096", "--batch",     "64",        "--precision",
                                  "f32,bf16",    "--steps", "3",           "--repeats", "1",
                                  "--warmup",    "1",       "--bucket-mb", "8",         "--json",
                                  json};
    if (after_all) args.push_back("--step-after-all");
    const ProcessResult r = run_process(args);
    INFO(r.out << r.err);
    REQUIRE(r.exit_code == 0);
  }
  std::ifstream in(json);
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  REQUIRE(rows.size() == 4);  // f32 and bf16, per bucket then after all
  for (std::size_t i = 0; i < 2; ++i) {
    const nlohmann::json &per_bucket = rows[i], &after_all = rows[i + 2];
    CAPTURE(per_bucket.dump());
    CHECK(per_bucket["world"] == 2);
    CHECK(per_bucket["buckets"].get<int>() >= 2);
    CHECK(per_bucket["all_reduces"] == per_bucket["buckets"]);  // one per bucket by default
    CHECK(per_bucket["bucket_step"] == true);
    CHECK(after_all["bucket_step"] == false);
    CHECK(per_bucket["weights_agree"] == true);
    CHECK(after_all["weights_agree"] == true);
    CHECK(per_bucket["precision"] == after_all["precision"]);
    CHECK(per_bucket["loss"] == after_all["loss"]);
    CHECK(per_bucket["weights_digest"] == after_all["weights_digest"]);
  }
}
