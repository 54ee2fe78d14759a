// mnist-train --recipe speedrun on the synthetic MNIST: a run per seed with its times apart and
// a JSON line each, the same run for the same seed, the flags the recipe sets refused, and on
// a GPU compiled steps that give exactly the --eager runs (the warm-up's state fully undone)
// and a kernel plan that leaves a warmed run only the tuner's check kernels to compile.
#include "mnist_train_util.h"

#include <sstream>

#include "kiln/kernel_plan.h"
#include "kiln/runtime/device.h"

using namespace mnist_test;

namespace {

std::vector<nlohmann::json> speedrun(const Scratch& s, const std::string& name, std::vector<std::string> extra) {
  const fs::path metrics = s.dir.path() / (name + ".jsonl");
  std::vector<std::string> args{"--data", s.dir.path().string(), "--recipe", "speedrun", "--metrics", metrics.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  const kiln_test::ProcessResult r = train(args);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("recipe speedrun: conv5x5-24, BN, pool, conv3x3-32, BN, pool, FC 800-256-10") != std::string::npos);
  CHECK(r.out.find("run(s): test accuracy mean") != std::string::npos);
  return json_lines(metrics);
}

}  // namespace

TEST_CASE("mnist-train --recipe speedrun: a line and a JSON object per seed, times apart, the same run per seed") {
  Scratch s;
  const auto runs = speedrun(s, "two", {"--device", "cpu", "--seeds", "2", "--seed", "7"});
  REQUIRE(runs.size() == 2);
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const nlohmann::json& j = runs[i];
    CAPTURE(j.dump());
    CHECK(j.at("seed") == 7 + i);
    CHECK(j.at("steps") == 4);  // 1024 samples in batches of 256
    CHECK(j.at("batch_size") == 256);
    CHECK(j.at("precision") == "bf16");
    CHECK(j.at("device") == "cpu");
    CHECK(j.at("compiled") == false);
    const double acc = j.at("test_accuracy").get<double>();
    CHECK(acc >= 0.0);
    CHECK(acc <= 1.0);
    CHECK(std::isfinite(j.at("test_loss").get<double>()));
    for (const char* t : {"train_seconds", "capture_seconds", "eval_seconds"}) CHECK(j.at(t).get<double>() > 0);
  }
  CHECK(runs[0].at("test_loss") != runs[1].at("test_loss"));  // another seed, another run
  const auto again = speedrun(s, "again", {"--device", "cpu", "--seed", "8"});
  REQUIRE(again.size() == 1);
  CHECK(again[0].at("test_loss") == runs[1].at("test_loss"));
  CHECK(again[0].at("test_accuracy") == runs[1].at("test_accuracy"));
}

TEST_CASE("mnist-train --recipe refuses the flags it sets; --seeds needs it") {
  Scratch s;
  const std::vector<std::vector<std::string>> fixed{{"--model", "cnn"},      {"--epochs", "2"},     {"--lr", "0.1"},
                                                    {"--batch-size", "64"},  {"--precision", "f32"}, {"--optimizer", "sgd"},
                                                    {"--schedule", "none"}, {"--eval-only"}};
  for (const auto& flag : fixed) {
    std::vector<std::string> args{"--data", s.dir.path().string(), "--device", "cpu", "--recipe", "speedrun"};
    args.insert(args.end(), flag.begin(), flag.end());
    const kiln_test::ProcessResult r = train(args);
    CAPTURE(flag[0]);
    CHECK(r.exit_code != 0);
    CHECK(r.err.find(flag[0] + " excludes --recipe") != std::string::npos);
  }
  const kiln_test::ProcessResult seeds = train({"--data", s.dir.path().string(), "--device", "cpu", "--seeds", "2"});
  CHECK(seeds.exit_code != 0);
  CHECK(seeds.err.find("--seeds requires --recipe") != std::string::npos);
  // Its kernel plan lists GPU kernels: on the CPU there are none.
  const kiln_test::ProcessResult plan = train({"--data", s.dir.path().string(), "--device", "cpu", "--recipe",
                                               "speedrun", "--kernel-plan", (s.dir.path() / "p.plan").string()});
  CHECK(plan.exit_code != 0);
  CHECK(plan.err.find("--kernel-plan lists GPU kernels") != std::string::npos);
  const kiln_test::ProcessResult unknown = train({"--device", "cpu", "--recipe", "fastest"});
  CHECK(unknown.exit_code != 0);
  CHECK(unknown.err.find("speedrun") != std::string::npos);
}

TEST_CASE("mnist-train --recipe speedrun on the GPU: compiled steps give exactly the --eager runs") {
  std::string why;
  if (!kiln::rt::gpu_available(&why)) {
    MESSAGE("skipped: needs a GPU (" << why << ")");
    return;
  }
  Scratch s;
  const auto compiled = speedrun(s, "compiled", {"--device", "cuda", "--seeds", "2", "--seed", "3"});
  const auto eager = speedrun(s, "eager", {"--device", "cuda", "--seeds", "2", "--seed", "3", "--eager"});
  REQUIRE(compiled.size() == 2);
  REQUIRE(eager.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(compiled[i].at("compiled") == true);
    CHECK(eager[i].at("compiled") == false);
    CHECK(compiled[i].at("test_loss") == eager[i].at("test_loss"));
    CHECK(compiled[i].at("test_accuracy") == eager[i].at("test_accuracy"));
  }
}

TEST_CASE("mnist-train --recipe speedrun --kernel-plan: warmed from its plan, the run compiles nothing") {
  std::string why;
  if (!kiln::rt::gpu_available(&why)) {
    MESSAGE("skipped: needs a GPU (" << why << ")");
    return;
  }
  // Files of MNIST's sizes: the plan's batches are the real files' (the recipe drops the short
  // last batch; the evaluation takes 1000 images at a time).
  jitcc_test::ScratchDir data, cache;
  write_split(data.path(), "train", 60000, 1);
  write_split(data.path(), "t10k", 10000, 2);
  const std::string plan = (data.path() / "speedrun.plan").string();
  const kiln_test::EnvOverrides env{{"KILN_CACHE_DIR", cache.path().string()}, {"KILN_LOG_LEVEL", "debug"}};
  const kiln_test::ProcessResult planned =
      train({"--data", data.path().string(), "--recipe", "speedrun", "--kernel-plan", plan, "--plan-only"}, env);
  INFO(planned.out << planned.err);
  REQUIRE(planned.exit_code == 0);
  CHECK(planned.out.find("kernel plan: ") != std::string::npos);
  CHECK(planned.out.find("recipe speedrun:") == std::string::npos);  // it stops before the data and the runs
  bool per_shape = false;
  for (const kiln::KernelPlan::Kernel& k : kiln::KernelPlan::load(plan).kernels)
    per_shape = per_shape || k.label.find("conv2d") != std::string::npos || k.label.find("gemm") != std::string::npos;
  CHECK(per_shape);
  const kiln_test::ProcessResult warm =
      jitcc_test::jitcc({"warm", "--plan", plan, "--arch", "auto", "--cache-dir", cache.path().string()});
  INFO(warm.out << warm.err);
  CHECK(warm.exit_code == 0);
  const kiln_test::ProcessResult run = train({"--data", data.path().string(), "--recipe", "speedrun"}, env);
  INFO(run.out << run.err);
  REQUIRE(run.exit_code == 0);
  // The debug log names each kernel compiled: none, as the pass planned every kernel the run
  // uses, the tuner's checks of the linear layers' algorithms among them.
  std::istringstream log(run.out + run.err);
  for (std::string line; std::getline(log, line);) CHECK_MESSAGE(line.find("[debug] compiled ") == std::string::npos, line);
  CHECK(run.out.find("kernels: 0 compiled") != std::string::npos);
}
