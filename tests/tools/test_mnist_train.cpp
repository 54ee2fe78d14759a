// mnist-train end to end on the CPU with a small synthetic MNIST (IDX files in a scratch
// directory): training, metrics, checkpoint save/load, eval-only, and its error messages.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/runtime/device.h"
#include "mnist_train_util.h"

using namespace kiln;
namespace fs = std::filesystem;

using namespace mnist_test;

TEST_CASE("mnist-train learns the synthetic set on the CPU, writes metrics and a checkpoint") {
  Scratch s;
  const fs::path metrics = s.dir.path() / "m.jsonl", ckpt = s.dir.path() / "model.safetensors";
  auto r = train({"--data", s.dir.path().string(), "--device", "cpu", "--epochs", "2", "--batch-size", "64",
                  "--metrics", metrics.string(), "--save", ckpt.string()});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("best test accuracy") != std::string::npos);
  CHECK(r.out.find("kernels:") != std::string::npos);
  auto lines = json_lines(metrics);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].at("epoch") == 1);
  CHECK(lines[1].at("epoch") == 2);
  for (const char* key : {"train_loss", "test_loss", "test_accuracy", "seconds", "samples_per_s", "precision"})
    CHECK(lines[1].contains(key));
  CHECK(lines[1].at("precision") == "default");  // TF32 convs, exact matmuls: the library's policy
  CHECK(r.out.find("precision default") != std::string::npos);
  CHECK(lines[1].at("train_loss").get<double>() < lines[0].at("train_loss").get<double>());
  const double acc = lines[1].at("test_accuracy").get<double>();
  CHECK(acc > 0.9);
  REQUIRE(fs::exists(ckpt));

  // The saved model evaluates to the same accuracy; a model of another shape is refused.
  auto e = train({"--data", s.dir.path().string(), "--device", "cpu", "--eval-only", "--load", ckpt.string()});
  REQUIRE(e.exit_code == 0);
  char want[32];
  std::snprintf(want, sizeof want, "test accuracy %.2f%%", 100 * acc);
  CHECK(e.out.find(want) != std::string::npos);
  auto bad = train(
      {"--data", s.dir.path().string(), "--device", "cpu", "--model", "cnn", "--eval-only", "--load", ckpt.string()});
  CHECK(bad.exit_code == 1);
  CHECK(bad.err.find("missing") != std::string::npos);
}

TEST_CASE("mnist-train --eval-only loads a PyTorch state dict of its model (safetensors.torch.save_file)") {
  Scratch s;
  // The mlp under PyTorch's names (nn.Sequential(Flatten, Linear, ReLU, Linear, ReLU, Linear)), as
  // save_file writes them: zero weights and an output bias for class 3, so every image is called
  // a 3 and the accuracy is the share of 3s in the test set, which no other weights give.
  nn::NamedTensors state{
      {"1.weight", zeros({512, 784})}, {"1.bias", zeros({512})},
      {"3.weight", zeros({512, 512})}, {"3.bias", zeros({512})},
      {"5.weight", zeros({10, 512})},  {"5.bias", from_vector<float>({0, 0, 0, 5, 0, 0, 0, 0, 0, 0})}};
  const fs::path torch_file = s.dir.path() / "torch.safetensors";
  io::save_safetensors(torch_file.string(), state, {{"format", "pt"}});
  const std::vector<std::uint8_t> labels =
      data::read_idx((s.dir.path() / "t10k-labels-idx1-ubyte.gz").string()).to_vector<std::uint8_t>();
  const auto threes = std::count(labels.begin(), labels.end(), std::uint8_t{3});
  REQUIRE(threes > 0);
  char want[48];
  std::snprintf(want, sizeof want, "test accuracy %.2f%%", 100.0 * static_cast<double>(threes) / labels.size());

  auto e = train({"--data", s.dir.path().string(), "--device", "cpu", "--eval-only", "--load", torch_file.string()});
  CHECK(e.exit_code == 0);
  CHECK(e.out.find(want) != std::string::npos);

  // A tensor of another dtype (a model.half() state dict) is refused, naming the tensor.
  state[4].second = zeros({10, 512}, {.dtype = DType::f16});
  io::save_safetensors(torch_file.string(), state, {{"format", "pt"}});
  auto bad = train({"--data", s.dir.path().string(), "--device", "cpu", "--eval-only", "--load", torch_file.string()});
  CHECK(bad.exit_code == 1);
  CHECK(bad.err.find("5.weight: dtype f16 in file, f32 expected") != std::string::npos);
}

TEST_CASE("mnist-train --eval-only refuses a checkpoint whose header hides garbage behind a NUL byte") {
  Scratch s;
  const fs::path ckpt = s.dir.path() / "nul.safetensors";
  // What mnist-train --save writes for the mlp, then the "\0 this is not JSON {{{" in the header.
  nn::NamedTensors state{{"model.1.weight", zeros({512, 784})}, {"model.1.bias", zeros({512})},
                         {"model.3.weight", zeros({512, 512})}, {"model.3.bias", zeros({512})},
                         {"model.5.weight", zeros({10, 512})},  {"model.5.bias", zeros({10})}};
  io::save_safetensors(ckpt.string(), state, {{"format", "kiln-checkpoint"}});
  std::ifstream in(ckpt, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  in.close();
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  std::string header = bytes.substr(8, n);
  header.erase(header.find_last_not_of(' ') + 1);
  header += std::string("\0 this is not JSON {{{", 22);
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((static_cast<std::uint64_t>(header.size()) >> (8 * i)) & 0xff);
  out += header + bytes.substr(8 + n);
  std::ofstream(ckpt, std::ios::binary | std::ios::trunc) << out;

  auto r = train({"--data", s.dir.path().string(), "--device", "cpu", "--eval-only", "--load", ckpt.string()});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("NUL") != std::string::npos);
  CHECK(r.err.find(ckpt.string()) != std::string::npos);
}

TEST_CASE("mnist-train: the same seed gives the same run") {
  Scratch s;
  std::vector<std::vector<nlohmann::json>> runs;
  for (int i = 0; i < 2; ++i) {
    const fs::path m = s.dir.path() / std::string("m").append(std::to_string(i)).append(".jsonl");
    auto r = train({"--data", s.dir.path().string(), "--device", "cpu", "--epochs", "1", "--batch-size", "128",
                    "--seed", "7", "--metrics", m.string()});
    REQUIRE(r.exit_code == 0);
    runs.push_back(json_lines(m));
  }
  CHECK(runs[0][0].at("train_loss").get<double>() == runs[1][0].at("train_loss").get<double>());
  CHECK(runs[0][0].at("test_accuracy").get<double>() == runs[1][0].at("test_accuracy").get<double>());
}

TEST_CASE("mnist-train --eager changes nothing on the CPU and is listed in --help") {
  Scratch s;
  const std::vector<std::string> common{"--device", "cpu", "--epochs", "1", "--batch-size", "128", "--seed", "3"};
  std::vector<std::string> eager = common;
  eager.push_back("--eager");
  const Run a = run_with_metrics(s, "default", common), b = run_with_metrics(s, "eager", eager);
  check_same_run(a, b);
  CHECK(a.process.out.find("on cpu (eager steps)") != std::string::npos);
  CHECK(a.process.out.find("graphs:") == std::string::npos);
  auto help = train({"--help"});
  CHECK(help.exit_code == 0);
  CHECK(help.out.find("--eager") != std::string::npos);
}

TEST_CASE(
    "mnist-train --precision: the default and tf32 are f32 on the CPU; bf16 and f16 (loss-scaled) train; all are "
    "reported") {
  Scratch s;
  const std::vector<std::string> common{"--device", "cpu", "--epochs", "1", "--batch-size", "128", "--seed", "3"};
  auto with = [&](const char* precision) {
    std::vector<std::string> flags = common;
    flags.insert(flags.end(), {"--precision", precision});
    return run_with_metrics(s, precision, flags);
  };
  const Run f32 = with("f32"), tf32 = with("tf32"), unset = run_with_metrics(s, "unset", common);
  // TF32 is a GPU tensor-core mode: nothing changes on the CPU.
  check_same_run(f32, tf32);
  check_same_run(f32, unset);
  CHECK(f32.metrics.back().at("precision") == "f32");
  CHECK(f32.process.out.find("precision f32") != std::string::npos);
  CHECK(tf32.metrics.back().at("precision") == "tf32");
  CHECK(tf32.process.out.find("precision tf32") != std::string::npos);
  CHECK(unset.metrics.back().at("precision") == "default");
  CHECK(unset.process.out.find("precision default") != std::string::npos);
  const Run named = with("default");  // the same as leaving it out
  check_same_run(unset, named);
  CHECK(named.metrics.back().at("precision") == "default");
  for (const char* p : {"bf16", "f16"}) {
    CAPTURE(p);
    const Run r = with(p);
    CHECK(r.process.out.find(std::string("precision ") + p) != std::string::npos);
    REQUIRE(r.metrics.size() == 1);
    CHECK(r.metrics[0].at("precision") == p);
    const double loss = r.metrics[0].at("train_loss").get<double>();
    CHECK(std::isfinite(loss));
    // Close to the f32 run: low-precision products, f32 weights and loss.
    CHECK(std::abs(loss - f32.metrics[0].at("train_loss").get<double>()) < 0.1);
    CHECK(r.metrics[0].at("test_accuracy").get<double>() > 0.8);
  }
  auto help = train({"--help"});
  CHECK(help.out.find("--precision") != std::string::npos);
  CHECK(help.out.find("{default,f32,tf32,bf16,f16}") != std::string::npos);
}

TEST_CASE("mnist-train: compiled steps on the GPU give the same run as --eager") {
  std::string why;
  if (!kiln::rt::gpu_available(&why)) {
    MESSAGE("skipped: compiled steps need a GPU (" << why << ")");
    return;
  }
  Scratch s;
  for (const char* model : {"mlp", "cnn"}) {
    CAPTURE(model);
    // Batch 100 of 1024 leaves a short last batch (a second signature); three epochs take
    // both signatures and the one-batch evaluation through eager, capture and replay.
    const std::vector<std::string> flags{"--device", "cuda",   "--model", model,          "--epochs",
                                         "3",        "--seed", "5",       "--batch-size", "100"};
    std::vector<std::string> eager = flags;
    eager.push_back("--eager");
    const Run compiled = run_with_metrics(s, std::string(model) + "-compiled", flags);
    const Run op_by_op = run_with_metrics(s, std::string(model) + "-eager", eager);
    INFO(compiled.process.out);
    check_same_run(compiled, op_by_op);
    CHECK(compiled.process.out.find("(compiled steps)") != std::string::npos);
    CHECK(op_by_op.process.out.find("(eager steps)") != std::string::npos);
    // Per epoch 10 batches of 100 and one of 24: 30 calls of one signature (28 replays after
    // the eager and the capturing call) and 3 of the other (1 replay).
    CHECK(compiled.process.out.find("training step graphs: 2 captured, 29 replays") != std::string::npos);
    CHECK(compiled.process.out.find("evaluation graphs: 1 captured, 1 replays") != std::string::npos);
    CHECK(op_by_op.process.out.find("graphs:") == std::string::npos);
    CHECK(compiled.metrics.back().at("test_accuracy").get<double>() > 0.5);
  }
}

TEST_CASE("mnist-train --precision bf16 and tf32 on the GPU: compiled steps give the same run as --eager") {
  std::string why;
  if (!kiln::rt::gpu_available(&why)) {
    MESSAGE("skipped: needs a GPU (" << why << ")");
    return;
  }
  Scratch s;
  for (const char* precision : {"bf16", "tf32"}) {
    CAPTURE(precision);
    const std::vector<std::string> flags{"--device", "cuda", "--epochs", "2", "--seed", "5", "--precision", precision};
    std::vector<std::string> eager = flags;
    eager.push_back("--eager");
    const Run compiled = run_with_metrics(s, std::string(precision) + "-compiled", flags);
    const Run op_by_op = run_with_metrics(s, std::string(precision) + "-eager", eager);
    check_same_run(compiled, op_by_op);
    CHECK(compiled.metrics.back().at("precision") == precision);
    CHECK(compiled.metrics.back().at("test_accuracy").get<double>() > 0.8);
  }
}

TEST_CASE("mnist-train says which files to put where when MNIST is missing") {
  jitcc_test::ScratchDir empty;
  auto r = train({"--data", (empty.path() / "nowhere").string(), "--device", "cpu"}, {{"KILN_MNIST_NO_DOWNLOAD", "1"}});
  CHECK(r.exit_code == 1);
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                        "t10k-labels-idx1-ubyte.gz", "KILN_MNIST_DIR"})
    CHECK(r.err.find(f) != std::string::npos);
}

TEST_CASE("mnist-train rejects bad flags with a message") {
  CHECK(train({"--model", "resnet"}).exit_code != 0);
  CHECK(train({"--optimizer", "rmsprop"}).exit_code != 0);
  auto r = train({"--device", "cpu", "--eval-only"}, {{"KILN_MNIST_NO_DOWNLOAD", "1"}});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("--eval-only needs --load") != std::string::npos);
}

TEST_CASE("mnist-train usage errors exit 2 with a 'mnist-train: error:' line, as jitcc and kiln-run") {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases{
      {{"--model", "resnet"}, "--model"},
      {{"--epochs", "abc"}, "expected an integer, got abc"},
      {{"--epochs", "2.5"}, "expected an integer, got 2.5"},
      {{"--batch-size", "x"}, "expected an integer, got x"},
      {{"--seeds", "many", "--recipe", "speedrun"}, "expected an integer, got many"},
      {{"--no-such-flag"}, "--no-such-flag"},
      {{"--plot", "chart.png"}, "expected a file name ending in .svg, got chart.png"},
      {{"--plot", "chart"}, "ending in .svg"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.args.front());
    const auto r = train(c.args, {{"KILN_MNIST_NO_DOWNLOAD", "1"}});
    CHECK(r.exit_code == 2);
    CHECK(r.err.rfind("mnist-train: error: ", 0) == 0);
    CHECK(r.err.find(c.says) != std::string::npos);
    CHECK(r.err.find("(run 'mnist-train --help')") != std::string::npos);
    CHECK(r.err.find("not in range") == std::string::npos);
  }
  CHECK(train({"--help"}).exit_code == 0);
  const auto upper = train({"--plot", "CHART.SVG", "--eval-only"}, {{"KILN_MNIST_NO_DOWNLOAD", "1"}});
  CHECK(upper.exit_code == 1);  // the name is accepted; --eval-only without --load is what fails
  CHECK(upper.err.find("--eval-only needs --load") != std::string::npos);
}

TEST_CASE("mnist-train under a launcher says that it trains on GPUs, not on the CPU") {
  Scratch s;
  // WORLD_SIZE is what kiln-run sets; KILN_NCCL_LIBRARY keeps a real NCCL out of the picture.
  const kiln_test::EnvOverrides launched{
      {"WORLD_SIZE", "1"}, {"RANK", "0"}, {"KILN_NCCL_LIBRARY", "/nonexistent/libnccl.so.2"}};
  const auto cpu = train({"--data", s.dir.path().string(), "--device", "cpu", "--epochs", "1"}, launched);
  CHECK(cpu.exit_code == 1);
  CHECK(cpu.err.find("--device cpu: under a launcher") != std::string::npos);
  CHECK(cpu.err.find("each rank trains on its GPU") != std::string::npos);
  CHECK(cpu.err.find("run mnist-train without the launcher") != std::string::npos);
  CHECK(cpu.out.find("epoch 1/") == std::string::npos);

  std::string why;
  if (kiln::rt::gpu_available(&why)) return;
  // No GPU: whatever stops the process group first, the message says what the launcher needs.
  const auto none = train({"--data", s.dir.path().string(), "--epochs", "1"}, launched);
  CHECK(none.exit_code == 1);
  CHECK(none.err.find("runs one rank per GPU, but this machine has no usable GPU") != std::string::npos);
  CHECK(none.err.find("without the launcher to train on the CPU") != std::string::npos);
}

TEST_CASE("mnist-train names an MNIST file that is a directory and downloads nothing over it") {
  Scratch s;
  const fs::path labels = s.dir.path() / "t10k-labels-idx1-ubyte.gz";
  fs::remove(labels);
  fs::create_directory(labels);
  // Downloads on: with no curl or wget on PATH an attempt fails fast, and it would print "downloading".
  const auto r = train({"--data", s.dir.path().string(), "--device", "cpu", "--epochs", "1"},
                       {{"PATH", "/nonexistent"}, {"KILN_MNIST_NO_DOWNLOAD", std::nullopt}});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find(labels.string() + " is a directory") != std::string::npos);
  CHECK(r.err.find("nothing was downloaded") != std::string::npos);
  CHECK(r.out.find("fetching") == std::string::npos);
  CHECK(r.out.find("downloading") == std::string::npos);
  CHECK(fs::is_directory(labels));
}

TEST_CASE("mnist-train refuses numeric flags out of range instead of replacing or wrapping them") {
  Scratch s;
  // --epochs and --lr 0 used to mean "the default"; --seed -1 wrapped to 2^64-1.
  for (const char* v : {"0", "-1", "1000001"}) check_refused(s, {"--epochs", v}, "--epochs");
  for (const char* v : {"0", "-5", "100000000000"}) check_refused(s, {"--batch-size", v}, "--batch-size");
  for (const char* v : {"0", "-0.1", "nan", "inf"}) check_refused(s, {"--lr", v}, "--lr");
  for (const char* v : {"-1", "-9223372036854775808"}) check_refused(s, {"--seed", v}, "--seed");
  for (const char* v : {"fp8", "F32", "bfloat16", "Default", ""}) check_refused(s, {"--precision", v}, "--precision");
}

TEST_CASE("mnist-train checks --save, --plot and --metrics before training") {
  Scratch s;
  const fs::path dir = s.dir.path();
  const std::string missing = (dir / "no-such-dir" / "x.svg").string();
  const fs::path plots = dir / "plots.svg";  // a directory with the name of an SVG file
  fs::create_directory(plots);
  for (const char* flag : {"--save", "--plot", "--metrics"}) {
    check_refused(s, {flag, missing}, missing);
    check_refused(s, {flag, missing}, flag);
    check_refused(s, {flag, std::string(flag) == "--plot" ? plots.string() : dir.string()}, "directory");
  }

  // --save and --plot rename a new file over the target, which would replace a symlink or a
  // fifo with a regular file: refused, left as they were.
  const fs::path real = dir / "real.safetensors", link = dir / "link.svg", fifo = dir / "fifo.svg";
  std::ofstream(real) << "keep me";
  fs::create_symlink(real, link);
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (const char* flag : {"--save", "--plot"}) {
    CAPTURE(flag);
    check_refused(s, {flag, link.string()}, "symbolic link");
    CHECK(fs::is_symlink(fs::symlink_status(link)));
    check_refused(s, {flag, fifo.string()}, "fifo");
    CHECK(fs::is_fifo(fs::symlink_status(fifo)));
  }
  std::ifstream in(real);
  CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == "keep me");
}

TEST_CASE("mnist-train fails, naming the file, when the metrics cannot be written") {
  Scratch s;
  auto r = train({"--data", s.dir.path().string(), "--device", "cpu", "--epochs", "1", "--batch-size", "256",
                  "--metrics", "/dev/full"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("/dev/full") != std::string::npos);
  CHECK(r.err.find("--metrics") != std::string::npos);
}
