// mnist-train under a launcher (data-parallel over NCCL): without NCCL a clear error; a world of
// one through NCCL gives exactly the plain run; on two GPUs the losses follow a one-GPU run of
// the same global batch (run when two GPUs and NCCL are there).
#include <cmath>
#include <cstdlib>

#include "kiln/dist.h"
#include "kiln/runtime/device.h"
#include "mnist_train_util.h"

using namespace mnist_test;

namespace {

// mnist-train on s's data under `kiln-run -n ranks`, metrics read back.
Run launched(const Scratch& s, const std::string& name, int ranks, const std::vector<std::string>& extra) {
  REQUIRE_MESSAGE(std::string(KILN_RUN_PATH) != "", "kiln-run was not built");
  const fs::path m = s.dir.path() / (name + ".jsonl");
  std::vector<std::string> argv{KILN_RUN_PATH, "-n", std::to_string(ranks), "--", KILN_MNIST_TRAIN_PATH,
                                "--data",      s.dir.path().string(),       "--metrics", m.string()};
  argv.insert(argv.end(), extra.begin(), extra.end());
  Run r{kiln_test::run_process(argv, {{"KILN_MNIST_DIR", std::nullopt}}), {}};
  INFO(name << ": " << r.process.out << r.process.err);
  REQUIRE(r.process.exit_code == 0);
  r.metrics = json_lines(m);
  return r;
}

}  // namespace

TEST_CASE("mnist-train under a launcher without NCCL: a clear error, not a crash") {
  Scratch s;
  // KILN_NCCL_LIBRARY, when set, is the only NCCL the loader tries.
  const kiln_test::ProcessResult r =
      train({"--data", s.dir.path().string(), "--epochs", "1"},
            {{"WORLD_SIZE", "1"}, {"RANK", "0"}, {"KILN_NCCL_LIBRARY", "/nonexistent/libnccl.so.2"}});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("[nccl] cannot load") != std::string::npos);
  CHECK(r.err.find("install the nvidia-nccl-cu13 wheel or set KILN_NCCL_LIBRARY") != std::string::npos);
  CHECK(r.out.find("epoch 1/") == std::string::npos);
}

TEST_CASE("mnist-train under kiln-run -n 1 (through NCCL) gives exactly the plain run") {
  std::string why;
  if (!kiln::rt::gpu_available(&why) || !kiln::dist::nccl_available(&why)) {
    MESSAGE("skipped: needs a GPU and NCCL (" << why << ")");
    return;
  }
  Scratch s;
  for (const char* eager : {"", "--eager"}) {
    CAPTURE(eager);
    std::vector<std::string> flags{"--model", "mlp", "--epochs", "2", "--seed", "3", "--batch-size", "100"};
    if (*eager) flags.push_back(eager);
    std::vector<std::string> plain = flags;
    plain.insert(plain.end(), {"--device", "cuda"});
    const Run one = run_with_metrics(s, std::string("plain") + eager, plain);
    const Run world1 = launched(s, std::string("world1") + eager, 1, flags);
    check_same_run(one, world1);
    CHECK(world1.process.out.find("on 1 GPU (data-parallel over NCCL, batch 100 per GPU)") != std::string::npos);
  }
}

TEST_CASE("mnist-train whose peer never joins NCCL's setup stops with a clear error, not a hang") {
  std::string why;
  if (!kiln::rt::gpu_available(&why) || !kiln::dist::nccl_available(&why)) {
    MESSAGE("skipped: needs a GPU and NCCL (" << why << ")");
    return;
  }
  // Rank 0 of 2 alone: the file rendezvous lets it through (it writes the id), so it waits in
  // NCCL's communicator setup for a rank 1 that never comes, as it would for one that died there.
  Scratch s;
  const std::string id_file = (s.dir.path() / "nccl-id").string();
  const kiln_test::ProcessResult r =
      train({"--data", s.dir.path().string(), "--model", "mlp", "--epochs", "1"},
            {{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"LOCAL_RANK", "0"}, {"KILN_DIST_ID_FILE", id_file},
             {"KILN_DIST_TIMEOUT_S", "3"}, {"MASTER_ADDR", std::nullopt}, {"MASTER_PORT", std::nullopt}});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("[dist.init] rank 0 of 2: NCCL's communicator setup did not complete within 3 s") !=
        std::string::npos);
  CHECK(r.out.find("epoch 1/") == std::string::npos);
  CHECK_FALSE(fs::exists(id_file));  // rank 0 cleans up the id it published
}

// The tolerance: the runs differ only in the order of floating-point sums (each rank's half batch,
// then the average of the halves), roundings that Adam carries through the epoch's 469 steps;
// 2e-3 relative on the epoch's mean loss leaves room for that and still catches a wrong shard,
// scale or missed all-reduce (those move the loss by percents). The mlp has no batch norm, whose
// statistics would be per rank.
TEST_CASE("mnist-train on two GPUs follows a one-GPU run of the same global batch") {
  std::string why;
  if (!kiln::rt::gpu_available(&why) || !kiln::dist::nccl_available(&why) || kiln::cuda_device_count() < 2) {
    MESSAGE("skipped: needs two GPUs and NCCL");
    return;
  }
  Scratch s;
  const std::vector<std::string> flags{"--model", "mlp", "--epochs", "1", "--seed", "3", "--eager"};
  std::vector<std::string> one = flags, two = flags;
  one.insert(one.end(), {"--device", "cuda", "--batch-size", "128"});
  two.insert(two.end(), {"--batch-size", "64"});
  const Run single = run_with_metrics(s, "one-gpu", one);
  const Run pair = launched(s, "two-gpus", 2, two);
  REQUIRE(single.metrics.size() == pair.metrics.size());
  for (std::size_t e = 0; e < single.metrics.size(); ++e) {
    CAPTURE(e);
    for (const char* key : {"train_loss", "test_loss"}) {
      const double a = single.metrics[e].at(key).get<double>(), b = pair.metrics[e].at(key).get<double>();
      CHECK(std::fabs(a - b) <= 2e-3 * std::fabs(a));
    }
  }
}

TEST_CASE("mnist-train --sync-bn: the mlp has no batch norm; --help says what it does without a launcher") {
  Scratch s;
  const kiln_test::ProcessResult mlp = train({"--data", s.dir.path().string(), "--model", "mlp", "--sync-bn"});
  CHECK(mlp.exit_code == 1);
  CHECK(mlp.err.find("[mnist-train] --sync-bn: the mlp has no batch norm") != std::string::npos);
  const kiln_test::ProcessResult help = train({"--help"});
  CHECK(help.exit_code == 0);
  CHECK(help.out.find("without a launcher the one process holds the whole batch") != std::string::npos);
}

// With SyncBatchNorm the cnn's statistics are those of the global batch, so two GPUs follow one
// GPU of the same global batch as the mlp does (without it each GPU normalises its own half).
TEST_CASE("mnist-train --model cnn --sync-bn on two GPUs follows a one-GPU run of the same global batch") {
  std::string why;
  if (!kiln::rt::gpu_available(&why) || !kiln::dist::nccl_available(&why) || kiln::cuda_device_count() < 2) {
    MESSAGE("skipped: needs two GPUs and NCCL");
    return;
  }
  Scratch s;
  const std::vector<std::string> flags{"--model", "cnn", "--epochs", "2", "--seed", "3"};
  std::vector<std::string> one = flags, two = flags;
  one.insert(one.end(), {"--device", "cuda", "--batch-size", "128"});
  two.insert(two.end(), {"--batch-size", "64", "--sync-bn"});
  const Run single = run_with_metrics(s, "one-gpu-cnn", one);
  const Run pair = launched(s, "two-gpus-cnn-sync-bn", 2, two);
  CHECK(pair.process.out.find("batch 64 per GPU, SyncBatchNorm)") != std::string::npos);
  REQUIRE(single.metrics.size() == pair.metrics.size());
  for (std::size_t e = 0; e < single.metrics.size(); ++e) {
    CAPTURE(e);
    for (const char* key : {"train_loss", "test_loss"}) {
      const double a = single.metrics[e].at(key).get<double>(), b = pair.metrics[e].at(key).get<double>();
      CHECK(std::fabs(a - b) <= 2e-3 * std::fabs(a));
    }
  }
}
