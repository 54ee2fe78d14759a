// mnist-train --checkpoint and --resume: a run killed (kill -9) once a checkpoint landed and
// resumed ends with the weights and per-epoch metrics of an uninterrupted run, bit for bit, on
// the CPU and (with a GPU) with compiled steps; and the settings and files --resume refuses.
#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "kiln/dist.h"
#include "kiln/runtime/device.h"
#include "mnist_train_util.h"

using namespace mnist_test;

namespace {

using Args = std::vector<std::string>;

// A synthetic MNIST of `train` training samples: enough for an epoch to outlast the kill's latency.
struct Data {
  jitcc_test::ScratchDir dir;
  explicit Data(std::int64_t train) {
    write_split(dir.path(), "train", train, 1);
    write_split(dir.path(), "t10k", 256, 2);
  }
  std::string file(const std::string& name) const { return (dir.path() / name).string(); }
};

Args operator+(Args a, const Args& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// mnist-train with `args`, started by `launcher` (e.g. kiln-run -n 2 --; none: directly).
kiln_test::ProcessResult train_launched(const Args& launcher, const Args& args) {
  return kiln_test::run_process(launcher + Args{KILN_MNIST_TRAIN_PATH} + args, {{"KILN_MNIST_DIR", std::nullopt}});
}

// train_launched, with SIGKILL to the launcher (or mnist-train) as soon as `checkpoint` exists
// (it appears whole: renamed into place); what it printed, then "exit <status>".
kiln_test::ProcessResult train_killed_at_checkpoint(const Args& launcher, const Args& args,
                                                    const std::string& checkpoint) {
  const char* script =
      "ck=$1; shift; \"$@\" & pid=$!\n"
      "while [ ! -e \"$ck\" ] && kill -0 $pid 2>/dev/null; do sleep 0.005; done\n"
      "kill -9 $pid 2>/dev/null; wait $pid; echo \"exit $?\"\n"
      "sleep 0.5\n";  // a launcher's ranks end just after it (PR_SET_PDEATHSIG), before the next run reads the file
  return train_launched(Args{"/bin/sh", "-c", script, "sh", checkpoint} + launcher, args);
}

// Every tensor of two --save files: same names, dtypes, shapes and bytes.
void check_same_weights(const std::string& a, const std::string& b) {
  const nn::NamedTensors x = io::load_safetensors(a), y = io::load_safetensors(b);
  REQUIRE(x.size() == y.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    CAPTURE(x[i].first);
    REQUIRE(x[i].first == y[i].first);
    REQUIRE(x[i].second.dtype() == y[i].second.dtype());
    REQUIRE(x[i].second.shape() == y[i].second.shape());
    const std::size_t bytes = static_cast<std::size_t>(x[i].second.numel()) * x[i].second.element_size();
    CHECK(std::memcmp(x[i].second.data_ptr(), y[i].second.data_ptr(), bytes) == 0);
  }
}

// The k of "resuming from <ck> after epoch k of <epochs>", or -1 when there is no such line.
int resumed_after(const std::string& out, const std::string& ck, int epochs) {
  const std::string head = "resuming from " + ck + " after epoch ";
  const std::size_t at = out.find(head);
  if (at == std::string::npos) return -1;
  const std::string rest = out.substr(at + head.size());
  const int k = std::stoi(rest);
  return rest.find(" of " + std::to_string(epochs) + "\n") == std::to_string(k).size() ? k : -1;
}

// One run with `args`, which must succeed, and its --metrics file read back.
Run run_ok(const Args& launcher, const Args& args, const std::string& metrics) {
  Run r{train_launched(launcher, args + Args{"--metrics", metrics}), {}};
  INFO(r.process.out << r.process.err);
  REQUIRE(r.process.exit_code == 0);
  r.metrics = json_lines(metrics);
  return r;
}

// `flags` (with --epochs `epochs`) run uninterrupted, and run with --checkpoint, killed once the
// first checkpoint landed, then restarted with --resume auto as kiln-run --max-restarts does: the
// same final weights and every epoch's losses and accuracy. Then the last checkpoint resumed once
// more trains nothing and saves the same weights. Every run started by `launcher`, the kill sent to
// it. Returns the epoch the resumed run continued after.
int check_resume_is_exact(const Data& d, const std::string& name, const Args& flags, int epochs,
                          const Args& launcher = {}) {
  const Args common = Args{"--data", d.dir.path().string(), "--epochs", std::to_string(epochs)} + flags;
  const std::string ck = d.file(name + "-ck.safetensors"), whole_save = d.file(name + "-whole.safetensors"),
                    resumed_save = d.file(name + "-resumed.safetensors");
  const Run whole = run_ok(launcher, common + Args{"--save", whole_save}, d.file(name + "-whole.jsonl"));

  const Args checkpointed = common + Args{"--checkpoint", ck, "--save", resumed_save};
  const kiln_test::ProcessResult killed =
      train_killed_at_checkpoint(launcher, checkpointed + Args{"--metrics", d.file(name + "-resumed.jsonl")}, ck);
  INFO("killed run: " << killed.out << killed.err);
  REQUIRE(killed.out.find("exit 137") != std::string::npos);  // killed, not finished
  REQUIRE(fs::exists(ck));
  CHECK_FALSE(fs::exists(resumed_save));

  const Run resumed = run_ok(launcher, checkpointed + Args{"--resume", "auto"}, d.file(name + "-resumed.jsonl"));
  INFO("resumed run: " << resumed.process.out);
  const int k = resumed_after(resumed.process.out, ck, epochs);
  REQUIRE(k >= 1);
  REQUIRE(k < epochs);
  CHECK(resumed.process.out.find("epoch " + std::to_string(k) + "/") == std::string::npos);  // not trained again
  CHECK(resumed.process.out.find("epoch " + std::to_string(k + 1) + "/") != std::string::npos);
  check_same_weights(whole_save, resumed_save);
  check_same_run(whole, resumed);  // the metrics file and the summary cover the whole run

  // The checkpoint of the last epoch: nothing left to train, the same weights saved.
  const std::string again_save = d.file(name + "-again.safetensors");
  const Run again =
      run_ok(launcher, common + Args{"--resume", ck, "--save", again_save}, d.file(name + "-again.jsonl"));
  CHECK(resumed_after(again.process.out, ck, epochs) == epochs);
  const std::string epoch_line = std::string("/").append(std::to_string(epochs)).append(" ");
  CHECK(again.process.out.find(epoch_line) == std::string::npos);  // no epoch line
  check_same_weights(whole_save, again_save);
  check_same_run(whole, again);
  return k;
}

// A refused --resume: exit 1 before any epoch, the message naming `needles`.
void check_refused_resume(const Args& args, const Args& needles) {
  const kiln_test::ProcessResult r = train(args, {{"KILN_MNIST_NO_DOWNLOAD", "1"}});
  std::string flags;
  for (const std::string& a : args) flags += a + " ";
  CAPTURE(flags);
  CHECK(r.exit_code != 0);
  for (const std::string& n : needles) CHECK_MESSAGE(r.err.find(n) != std::string::npos, r.err);
  CHECK(r.out.find("resuming from") == std::string::npos);
  CHECK(r.out.find(" train loss ") == std::string::npos);
}

}  // namespace

TEST_CASE("mnist-train --resume after kill -9: the same weights and metrics as an uninterrupted run (CPU)") {
  const Data d(4096);
  const Args cpu{"--device", "cpu", "--batch-size", "512", "--seed", "4"};
  MESSAGE("mlp (default precision) resumed after epoch " << check_resume_is_exact(d, "mlp", cpu, 3));
  // The loss scaler's state, SGD's momentum and the one-cycle schedule's position.
  MESSAGE("mlp f16 sgd resumed after epoch " << check_resume_is_exact(
              d, "mlp-f16", cpu + Args{"--precision", "f16", "--optimizer", "sgd", "--schedule", "onecycle"}, 3));
}

TEST_CASE("mnist-train --resume refuses other settings, other data, missing and corrupt files") {
  Scratch s;
  const std::string dir = s.dir.path().string(), ck = (s.dir.path() / "ck.safetensors").string();
  const Args base{"--data", dir, "--device", "cpu", "--batch-size", "256"};
  auto first = train(base + Args{"--epochs", "2", "--checkpoint", ck});
  REQUIRE(first.exit_code == 0);
  REQUIRE(fs::exists(ck));
  const Args resume = base + Args{"--resume", ck};

  check_refused_resume(resume + Args{"--epochs", "3"},
                       {"[mnist-train] --resume " + ck + " was written with --epochs 2, this run asks --epochs 3"});
  check_refused_resume(resume + Args{"--epochs", "2", "--lr", "0.01", "--seed", "9"},
                       {"was written with --lr 0.001 --seed 0, this run asks --lr 0.01 --seed 9"});
  check_refused_resume(
      resume + Args{"--epochs", "2", "--model", "cnn", "--precision", "bf16"},
      {"was written with --model mlp --lr 0.001 --schedule cosine --precision default, this run asks --model cnn "
       "--lr 0.002 --schedule onecycle --precision bf16"});
  check_refused_resume({"--data", dir, "--device", "cpu", "--batch-size", "128", "--epochs", "2", "--resume", ck},
                       {"was written with --batch-size 256, this run asks --batch-size 128"});

  // A checkpoint written at --precision f32 (the trainer's default before `default`) resumes with that flag only.
  const std::string ck32 = (s.dir.path() / "ck32.safetensors").string();
  REQUIRE(train(base + Args{"--epochs", "1", "--precision", "f32", "--checkpoint", ck32}).exit_code == 0);
  check_refused_resume(base + Args{"--epochs", "1", "--resume", ck32},
                       {"was written with --precision f32, this run asks --precision default"});
  const auto f32_again = train(base + Args{"--epochs", "1", "--precision", "f32", "--resume", ck32});
  CHECK_MESSAGE(f32_again.exit_code == 0, f32_again.err);
  CHECK(f32_again.out.find("resuming from " + ck32 + " after epoch 1 of 1") != std::string::npos);

  // Other data: the checkpointed run's order of samples cannot repeat.
  const Data other(2048);
  check_refused_resume(
      {"--data", other.dir.path().string(), "--device", "cpu", "--batch-size", "256", "--epochs", "2", "--resume", ck},
      {"--resume " + ck, "written for 1024 training samples, this data has 2048"});

  const std::string missing = (s.dir.path() / "none.safetensors").string();
  check_refused_resume(base + Args{"--epochs", "2", "--resume", missing}, {"--resume " + missing, "no such file"});
  const std::string garbage = (s.dir.path() / "garbage.safetensors").string();
  std::ofstream(garbage) << "not a checkpoint at all";
  check_refused_resume(base + Args{"--epochs", "2", "--resume", garbage}, {"--resume " + garbage});
  // Cut short, as a copy interrupted midway would be.
  const std::string cut = (s.dir.path() / "cut.safetensors").string();
  fs::copy_file(ck, cut);
  fs::resize_file(cut, fs::file_size(ck) / 2);
  check_refused_resume(base + Args{"--epochs", "2", "--resume", cut}, {"--resume " + cut});
  // A --save file is a checkpoint of the model alone.
  const std::string saved = (s.dir.path() / "saved.safetensors").string();
  REQUIRE(train(base + Args{"--epochs", "1", "--save", saved}).exit_code == 0);
  check_refused_resume(base + Args{"--epochs", "1", "--resume", saved},
                       {"--resume " + saved, "no mnist-train state", "--load"});

  // Usage errors, before any data is read.
  check_refused_resume(base + Args{"--resume", "auto"}, {"--resume auto needs --checkpoint"});
  check_refused_resume(resume + Args{"--load", ck}, {"--resume", "--load"});
  check_refused_resume(resume + Args{"--eval-only"}, {"--resume", "--eval-only"});
  check_refused_resume({"--recipe", "speedrun", "--checkpoint", ck}, {"--recipe", "--checkpoint"});

  // The checkpoint loads with --load too (model and optimizer; the rest ignored).
  auto eval = train({"--data", dir, "--device", "cpu", "--eval-only", "--load", ck});
  CHECK(eval.exit_code == 0);
  CHECK(eval.out.find("test accuracy") != std::string::npos);
}

TEST_CASE("mnist-train --resume auto without a checkpoint yet starts from the first epoch") {
  Scratch s;
  const std::string ck = (s.dir.path() / "ck.safetensors").string();
  auto r = train({"--data", s.dir.path().string(), "--device", "cpu", "--epochs", "1", "--batch-size", "256",
                  "--checkpoint", ck, "--resume", "auto"});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("resuming") == std::string::npos);
  CHECK(r.out.find("epoch 1/1") != std::string::npos);
  CHECK(fs::exists(ck));
  const io::Metadata meta = io::checkpoint_metadata(ck);
  const nlohmann::json state = nlohmann::json::parse(meta.at("mnist-train"));
  CHECK(state.at("epoch") == 1);
  CHECK(state.at("metrics").size() == 1);
  CHECK(state.at("settings").at("--epochs") == 1);
  CHECK(state.at("settings").at("--precision") == "default");
  CHECK(state.at("data").at("samples") == 1024);
}

TEST_CASE("mnist-train --resume after kill -9 with compiled steps on the GPU: the same weights and metrics") {
  std::string why;
  if (!kiln::rt::gpu_available(&why)) {
    MESSAGE("skipped: compiled steps need a GPU (" << why << ")");
    return;
  }
  // Epochs of 256 short steps: the kill lands a few epochs in, whichever it is.
  const Data d(16384);
  const Args gpu{"--device", "cuda", "--batch-size", "64", "--seed", "6"};
  for (const char* precision : {"f32", "bf16"})
    for (const char* model : {"mlp", "cnn"}) {
      const std::string name = std::string(model) + "-" + precision;
      CAPTURE(name);
      MESSAGE(name << " resumed after epoch "
                   << check_resume_is_exact(d, name, gpu + Args{"--model", model, "--precision", precision}, 12));
    }
  // f16: the loss scale and its growth tracker live on the device, read by the captured step.
  MESSAGE("mlp f16 sgd resumed after epoch "
          << check_resume_is_exact(d, "mlp-f16", gpu + Args{"--precision", "f16", "--optimizer", "sgd"}, 12));
}

TEST_CASE("mnist-train --resume on two GPUs: kiln-run killed, restarted, the same weights and metrics") {
  std::string why;
  if (!kiln::rt::gpu_available(&why) || !kiln::dist::nccl_available(&why) || kiln::cuda_device_count() < 2) {
    MESSAGE("skipped: needs two GPUs and NCCL");
    return;
  }
  REQUIRE_MESSAGE(std::string(KILN_RUN_PATH) != "", "kiln-run was not built");
  // kill -9 of kiln-run ends its ranks (PR_SET_PDEATHSIG); both ranks of the restart read the checkpoint.
  const Data d(16384);
  const Args launcher{KILN_RUN_PATH, "-n", "2", "--"};
  for (const char* model : {"mlp", "cnn"}) {
    CAPTURE(model);
    MESSAGE(model << " on 2 GPUs resumed after epoch "
                  << check_resume_is_exact(d, std::string(model) + "-2gpu",
                                           {"--batch-size", "32", "--seed", "6", "--model", model}, 12, launcher));
  }
}
