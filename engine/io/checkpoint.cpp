// Loading named tensors into a model, and checkpoints: a module's state as "model.<name>",
// an optimizer's as "optim.<name>" and the caller's extras as "extra.<name>" in one
// safetensors file.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kiln/autograd.h"
#include "kiln/error.h"
#include "kiln/io/safetensors.h"
#include "kiln/optim/optimizer.h"

namespace kiln::io {

namespace {

constexpr const char* kFormat = "kiln-checkpoint";
constexpr const char* kModel = "model.";
constexpr const char* kOptim = "optim.";
constexpr const char* kExtra = "extra.";

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

// Every difference between what `from` offers and what `into` needs, in one line; empty when
// they match: missing names, then unexpected ones, then dtype and shape mismatches.
std::string mismatches(const nn::NamedTensors& from, const nn::NamedTensors& into) {
  std::map<std::string, const Tensor*> offered, wanted;
  for (const auto& [name, t] : from) offered.emplace(name, &t);
  for (const auto& [name, t] : into) wanted.emplace(name, &t);
  std::vector<std::string> missing, unexpected, wrong;
  for (const auto& [name, t] : into) {
    const auto it = offered.find(name);
    if (it == offered.end()) {
      missing.push_back(name);
      continue;
    }
    const Tensor& src = *it->second;
    if (src.dtype() != t.dtype())
      wrong.push_back(name + ": dtype " + std::string(dtype_name(src.dtype())) + " in file, " +
                      std::string(dtype_name(t.dtype())) + " expected");
    else if (src.shape() != t.shape())
      wrong.push_back(name + ": shape " + shape_str(src.shape()) + " in file, " + shape_str(t.shape()) + " expected");
  }
  for (const auto& [name, t] : from)
    if (!wanted.count(name)) unexpected.push_back(name);
  std::vector<std::string> parts;
  if (!missing.empty()) parts.push_back("missing " + join(missing, ", "));
  if (!unexpected.empty()) parts.push_back("unexpected " + join(unexpected, ", "));
  parts.insert(parts.end(), wrong.begin(), wrong.end());
  return join(parts, "; ");
}

void copy_checked(const nn::NamedTensors& from, const nn::NamedTensors& into) {
  std::map<std::string, const Tensor*> offered;
  for (const auto& [name, t] : from) offered.emplace(name, &t);
  NoGradGuard no_grad;
  for (const auto& [name, t] : into) {
    Tensor dst = t;
    dst.copy_(*offered.at(name));
  }
}

// Names under `prefix`, with the prefix taken off.
nn::NamedTensors take_prefix(const nn::NamedTensors& all, const std::string& prefix) {
  nn::NamedTensors out;
  for (const auto& [name, t] : all)
    if (name.compare(0, prefix.size(), prefix) == 0) out.emplace_back(name.substr(prefix.size()), t);
  return out;
}

// The file's tensors, its format checked and only known prefixes allowed; `meta` without "format".
nn::NamedTensors read_checkpoint(const std::string& path, Metadata& meta) {
  nn::NamedTensors all = load_safetensors(path, &meta);
  const auto format = meta.find("format");
  if (format == meta.end() || format->second != kFormat)
    throw IoError(path, 8,
                  std::string("expected __metadata__ {\"format\": \"") + kFormat + "\"}, found " +
                      (format == meta.end() ? "no format" : "format \"" + format->second + "\""));
  meta.erase(format);
  std::vector<std::string> strays;
  for (const auto& [name, t] : all)
    if (name.rfind(kModel, 0) != 0 && name.rfind(kOptim, 0) != 0 && name.rfind(kExtra, 0) != 0) strays.push_back(name);
  if (!strays.empty())
    throw ValueError("[io] " + path + ": names outside model., optim. and extra.: " + join(strays, ", "));
  return all;
}

}  // namespace

void copy_into(const nn::NamedTensors& from, const nn::NamedTensors& into, const std::string& what) {
  if (const std::string problems = mismatches(from, into); !problems.empty())
    throw ValueError("[io] " + what + ": " + problems);
  copy_checked(from, into);
}

void save_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer* opt,
                     const CheckpointExtras& extras) {
  if (extras.metadata.count("format"))
    throw ValueError("[io] " + path + ": the metadata key \"format\" is the checkpoint's own, not an extra");
  nn::NamedTensors all;
  for (auto& [name, t] : model.state()) all.emplace_back(kModel + name, t);
  if (opt)
    for (auto& [name, t] : opt->state()) all.emplace_back(kOptim + name, t);
  for (auto& [name, t] : extras.tensors) all.emplace_back(kExtra + name, t);
  Metadata meta = extras.metadata;
  meta.emplace("format", kFormat);
  save_safetensors(path, all, meta);
}

void load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer* opt, CheckpointExtras* extras) {
  Metadata meta;
  const nn::NamedTensors all = read_checkpoint(path, meta);

  // The model is checked before the optimizer loads, and the optimizer checks its own state
  // before changing anything, so a mismatch in either leaves both as they were.
  const nn::NamedTensors model_part = take_prefix(all, kModel), optim_part = take_prefix(all, kOptim);
  const nn::NamedTensors state = model.state();
  if (const std::string problems = mismatches(model_part, state); !problems.empty())
    throw ValueError("[io] model: " + problems);
  if (opt && !optim_part.empty()) {
    try {
      opt->load_state(optim_part);
    } catch (const ValueError& e) {
      throw ValueError("[io] " + path + ": the optimizer state under \"optim.\": " + e.what());
    }
  }
  copy_checked(model_part, state);
  if (extras) *extras = {take_prefix(all, kExtra), std::move(meta)};
}

Metadata checkpoint_metadata(const std::string& path) {
  Metadata meta;
  read_checkpoint(path, meta);
  return meta;
}

}  // namespace kiln::io
