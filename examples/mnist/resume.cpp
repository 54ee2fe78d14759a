#include "resume.h"

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

namespace mnist {

using namespace kiln;
using Json = nlohmann::ordered_json;

namespace {

constexpr const char* kKey = "mnist-train";  // the checkpoint's metadata entry holding the run's state
constexpr int kVersion = 1;
constexpr const char* kScaler = "scaler.";  // the GradScaler's tensors among the checkpoint's extras

// What a continuation must share with the run it continues, keyed as the message names it.
Json fixed_settings(const TrainOptions& o, int world) {
  return {{"--model", o.model},       {"--epochs", o.epochs.value()}, {"--batch-size", o.batch_size},
          {"world size", world},      {"--lr", o.lr.value()},         {"--optimizer", o.optimizer},
          {"--schedule", o.schedule}, {"--precision", o.precision},   {"--seed", o.seed}};
}

std::string setting_text(const std::string& key, const Json* v) {
  if (!v) return key + " (unset)";
  return key + " " + (v->is_string() ? v->get<std::string>() : v->dump());
}

// FNV-1a of the sample order of the loader's current epoch: a resumed run checks that it sees
// the batches the interrupted one would have (the same data size, seed and permutation).
std::string order_digest(const data::DataLoader& loader) {
  std::vector<Tensor> parts;
  for (std::int64_t i = 0; i < loader.batches(); ++i) parts.push_back(loader.indices(i));
  std::uint64_t h = 14695981039346656037ull;
  for (const std::int64_t v : cat(parts).to(Device::cpu()).to_vector<std::int64_t>())
    for (int byte = 0; byte < 8; ++byte) {
      h ^= (static_cast<std::uint64_t>(v) >> (8 * byte)) & 0xff;
      h *= 1099511628211ull;
    }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

Json generator_state(const Generator& g) { return {{"seed", g.seed()}, {"offset", g.offset()}}; }

Json metrics_json(const std::vector<EpochMetrics>& metrics) {
  Json out = Json::array();
  for (const EpochMetrics& m : metrics)  // doubles round-trip exactly through nlohmann's output
    out.push_back({{"epoch", m.epoch},
                   {"train_loss", m.train_loss},
                   {"test_loss", m.test_loss},
                   {"test_accuracy", m.test_accuracy},
                   {"seconds", m.seconds},
                   {"samples_per_s", m.samples_per_s}});
  return out;
}

std::vector<EpochMetrics> metrics_from(const Json& j) {
  std::vector<EpochMetrics> out;
  for (const Json& m : j)
    out.push_back({.epoch = m.at("epoch").get<int>(),
                   .train_loss = m.at("train_loss").get<double>(),
                   .test_loss = m.at("test_loss").get<double>(),
                   .test_accuracy = m.at("test_accuracy").get<double>(),
                   .seconds = m.at("seconds").get<double>(),
                   .samples_per_s = m.at("samples_per_s").get<double>()});
  return out;
}

// The run's state in the file, checked against this run's settings and data before anything loads.
Json read_state(const std::string& path, const std::string& who, const TrainOptions& o, int world,
                const data::DataLoader& loader) {
  io::Metadata meta;
  try {
    meta = io::checkpoint_metadata(path);
  } catch (const IoError& e) {
    throw ValueError(who + ": " + e.what());
  }
  const auto entry = meta.find(kKey);
  if (entry == meta.end())
    throw ValueError(who +
                     ": the checkpoint holds no mnist-train state (--checkpoint writes it; a --save file "
                     "goes to --load)");
  const Json state = Json::parse(entry->second);
  if (state.at("version").get<int>() != kVersion)
    throw ValueError(who + ": mnist-train state version " + state.at("version").dump() + ", this build reads " +
                     std::to_string(kVersion));
  const Json want = fixed_settings(o, world), &had = state.at("settings");
  std::string was, asks;
  for (const auto& [key, v] : want.items()) {
    const auto it = had.find(key);
    if (it != had.end() && *it == v) continue;
    (was += ' ') += setting_text(key, it == had.end() ? nullptr : &*it);  // not " " + ...: GCC 12's -Wrestrict
    (asks += ' ') += setting_text(key, &v);
  }
  if (!was.empty()) throw ValueError(who + " was written with" + was + ", this run asks" + asks);
  const int epoch = state.at("epoch").get<int>();
  if (epoch < 1 || epoch > o.epochs.value() || state.at("metrics").size() != static_cast<std::size_t>(epoch))
    throw ValueError(who + ": the state says " + std::to_string(epoch) + " of " + std::to_string(*o.epochs) +
                     " epochs done with " + std::to_string(state.at("metrics").size()) + " epochs of metrics");
  if (state.at("data").at("samples").get<std::int64_t>() != loader.size())
    throw ValueError(who + ": written for " + state.at("data").at("samples").dump() +
                     " training samples, this data has " + std::to_string(loader.size()));
  return state;
}

}  // namespace

std::string resume_path(const TrainOptions& o) {
  if (o.resume != "auto") return o.resume;
  return std::filesystem::exists(o.checkpoint) ? o.checkpoint : std::string();
}

void write_checkpoint(const std::string& path, const TrainOptions& o, int world, const RunParts& run,
                      const RunSoFar& so_far) {
  io::CheckpointExtras extras;
  if (run.scaler.enabled())
    for (const auto& [name, t] : run.scaler.state()) extras.tensors.emplace_back(kScaler + name, t);
  const Json state = {
      {"version", kVersion},
      {"settings", fixed_settings(o, world)},
      {"epoch", so_far.epoch},
      {"step", so_far.step},
      {"schedule_step", run.schedule ? run.schedule->current_step() : 0},
      // Nothing draws from them while training today; kept so a model with dropout resumes exactly too.
      {"generators", {{"init", generator_state(run.init)}, {"default", generator_state(default_generator())}}},
      {"data", {{"seed", o.seed}, {"samples", run.loader.size()}, {"order_digest", order_digest(run.loader)}}},
      {"metrics", metrics_json(so_far.metrics)}};
  extras.metadata[kKey] = state.dump();
  io::save_checkpoint(path, run.model, &run.opt, extras);
}

RunSoFar resume_from(const std::string& path, const TrainOptions& o, int world, RunParts& run) {
  const std::string who = "[mnist-train] --resume " + path;
  try {
    const Json state = read_state(path, who, o, world, run.loader);
    RunSoFar so_far{state.at("epoch").get<int>(), state.at("step").get<std::int64_t>(),
                    metrics_from(state.at("metrics"))};
    // The loader's order is a pure function of (seed, epoch): the last epoch done must repeat.
    run.loader.set_epoch(so_far.epoch - 1);
    if (order_digest(run.loader) != state.at("data").at("order_digest").get<std::string>())
      throw ValueError(who + ": the data order of epoch " + std::to_string(so_far.epoch) +
                       " differs from the checkpointed run's (other data, or another loader)");
    const Json& gens = state.at("generators");
    if (gens.at("init").at("seed").get<std::uint64_t>() != run.init.seed())
      throw ValueError(who + ": the initial weights' generator had seed " + gens.at("init").at("seed").dump());

    io::CheckpointExtras extras;
    io::load_checkpoint(path, run.model, &run.opt, &extras);
    if (run.scaler.enabled()) {
      nn::NamedTensors scaler;
      for (const auto& [name, t] : extras.tensors)
        if (name.rfind(kScaler, 0) == 0) scaler.emplace_back(name.substr(std::string(kScaler).size()), t);
      run.scaler.load_state(scaler);
    }
    // Before the training step is built, so a compiled step's first call sees the restored lr and step count.
    if (run.schedule) run.schedule->set_step(state.at("schedule_step").get<std::int64_t>());
    run.init.set_offset(gens.at("init").at("offset").get<std::uint64_t>());
    default_generator().manual_seed(gens.at("default").at("seed").get<std::uint64_t>());
    default_generator().set_offset(gens.at("default").at("offset").get<std::uint64_t>());
    return so_far;
  } catch (const Json::exception& e) {
    throw ValueError(who + ": unreadable mnist-train state (" + e.what() + ")");
  } catch (const ValueError& e) {
    const std::string msg = e.what();
    if (msg.rfind(who, 0) == 0) throw;
    throw ValueError(who + ": " + msg);
  }
}

}  // namespace mnist
