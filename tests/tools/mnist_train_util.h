#pragma once
// mnist-train run as a child process on a small synthetic MNIST written to a scratch
// directory, for the tests of the trainer and of its outputs.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "jitcc_test_util.h"
#include "kiln/kiln.h"
#include "process.h"

namespace mnist_test {

using namespace kiln;
namespace fs = std::filesystem;

// n images whose class k is a bright 7x7 block at one of 10 spots, plus noise: learnable
// within an epoch, and not by a constant guess.
inline void write_split(const fs::path& dir, const std::string& prefix, std::int64_t n, std::uint64_t seed) {
  Generator gen(seed);
  Tensor labels = randint(0, 10, {n}, {}, &gen);
  Tensor noise = randint(0, 60, {n, 28, 28}, {.dtype = DType::i32}, &gen);
  std::vector<std::int32_t> px = noise.to_vector<std::int32_t>();
  const std::vector<std::int64_t> ls = labels.to_vector<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t k = ls[static_cast<std::size_t>(i)], r0 = (k / 5) * 14 + 3, c0 = (k % 5) * 5;
    for (std::int64_t r = r0; r < r0 + 7; ++r)
      for (std::int64_t c = c0; c < c0 + 5; ++c) px[static_cast<std::size_t>(i * 784 + r * 28 + c)] = 250;
  }
  Tensor images = from_vector(px, {n, 28, 28}).to(DType::u8);
  data::write_idx((dir / (prefix + "-images-idx3-ubyte")).string(), images);
  data::write_idx((dir / (prefix + "-labels-idx1-ubyte.gz")).string(), labels.to(DType::u8), true);
}

struct Scratch {
  jitcc_test::ScratchDir dir;
  Scratch() {
    write_split(dir.path(), "train", 1024, 1);
    write_split(dir.path(), "t10k", 256, 2);
  }
};

inline kiln_test::ProcessResult train(const std::vector<std::string>& args, kiln_test::EnvOverrides env = {}) {
  REQUIRE_MESSAGE(std::string(KILN_MNIST_TRAIN_PATH) != "", "mnist-train was not built (KILN_BUILD_EXAMPLES=OFF)");
  std::vector<std::string> argv{KILN_MNIST_TRAIN_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  env.emplace_back("KILN_MNIST_DIR", std::nullopt);
  kiln_test::ProcessResult r = kiln_test::run_process(argv, env);
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.exit_code < 128);
  return r;
}

inline std::vector<nlohmann::json> json_lines(const fs::path& p) {
  std::ifstream in(p);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

// Runs mnist-train on s's data, one cheap epoch, with `extra` flags; a refused flag must
// fail before any epoch runs (no "epoch 1/" line) with a message naming `needle`.
inline void check_refused(const Scratch& s, const std::vector<std::string>& extra, const std::string& needle) {
  std::vector<std::string> args{"--data", s.dir.path().string(), "--device", "cpu"};
  for (const std::string flag : {"--epochs", "--batch-size"})  // one cheap epoch unless `extra` sets them
    if (std::find(extra.begin(), extra.end(), flag) == extra.end())
      args.insert(args.end(), {flag, flag == "--epochs" ? "1" : "256"});
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = train(args, {{"KILN_MNIST_NO_DOWNLOAD", "1"}});
  std::string flags;
  for (const std::string& e : extra) flags += e + " ";
  CAPTURE(flags);
  CHECK(r.exit_code != 0);
  CHECK(r.err.find(needle) != std::string::npos);
  CHECK(r.out.find("epoch 1/") == std::string::npos);
}

struct Run {
  kiln_test::ProcessResult process;
  std::vector<nlohmann::json> metrics;
};

// One run on s's data with `extra` flags after the common ones; metrics read back.
inline Run run_with_metrics(const Scratch& s, const std::string& name, const std::vector<std::string>& extra) {
  const fs::path m = s.dir.path() / (name + ".jsonl");
  std::vector<std::string> args{"--data", s.dir.path().string(), "--metrics", m.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  Run r{train(args), {}};
  INFO(name << ": " << r.process.out << r.process.err);
  REQUIRE(r.process.exit_code == 0);
  r.metrics = json_lines(m);
  return r;
}

// Every epoch's losses and accuracy bit for bit (times differ), and the printed best accuracy.
inline void check_same_run(const Run& a, const Run& b) {
  REQUIRE(a.metrics.size() == b.metrics.size());
  for (std::size_t e = 0; e < a.metrics.size(); ++e) {
    CAPTURE(e);
    for (const char* key : {"train_loss", "test_loss", "test_accuracy"})
      CHECK(a.metrics[e].at(key).get<double>() == b.metrics[e].at(key).get<double>());
  }
  auto best = [](const std::string& out) { return out.substr(out.find("best test accuracy")).substr(0, 30); };
  CHECK(best(a.process.out) == best(b.process.out));
}

}  // namespace mnist_test
