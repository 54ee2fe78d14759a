// KernelPlan's file: JSON, so a plan can be read and edited by hand; written atomically.
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "kiln/error.h"
#include "kiln/io/output_path.h"
#include "kiln/kernel_plan.h"

namespace kiln {

namespace {

constexpr int kPlanFormat = 1;

KernelPlan::Kernel kernel_of(const nlohmann::json& k, const std::string& path, std::size_t i) {
  const std::string who = "[kernel plan] " + path + ": kernel " + std::to_string(i) + " ";
  if (!k.is_object()) throw ValueError(who + "is not an object");
  KernelPlan::Kernel out;
  try {
    out.op = k.at("op").get<std::string>();
    out.dtypes = k.at("dtypes").get<std::string>();
    out.variant = k.at("variant").get<std::uint32_t>();
    out.label = k.value("label", std::string());
    out.source = k.value("source", std::string());
    out.late = k.value("late", false);
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(who + "needs op, dtypes (strings) and variant (a number): " + e.what());
  }
  if (out.op.empty() || out.dtypes.empty()) throw ValueError(who + "has an empty op or dtypes");
  if (!out.label.empty() && out.source.empty())
    throw ValueError(who + "(" + out.label + ") is generated but has no source to rebuild it from");
  return out;
}

// A step's groups; a plan written before steps were recorded has none.
std::vector<KernelPlan::Step> steps_of(const nlohmann::json& j, const std::string& path) {
  std::vector<KernelPlan::Step> out;
  const auto list = j.find("steps");
  if (list == j.end()) return out;
  const std::string who = "[kernel plan] " + path + ": ";
  if (!list->is_array()) throw ValueError(who + "\"steps\" is not a list");
  for (std::size_t i = 0; i < list->size(); ++i) {
    const nlohmann::json& s = (*list)[i];
    KernelPlan::Step step;
    try {
      step.signature = s.at("signature").get<std::string>();
      for (const nlohmann::json& g : s.at("groups"))
        step.groups.push_back({g.at("ops").get<std::vector<std::string>>(), g.at("shape").get<std::string>(),
                               g.at("result").get<std::string>(), g.value("ended", std::string())});
    } catch (const nlohmann::json::exception& e) {
      throw ValueError(who + "step " + std::to_string(i) +
                       " needs a signature and groups, each with ops (a list), shape and result: " + e.what());
    }
    out.push_back(std::move(step));
  }
  return out;
}

// The tuner's measurements; a plan written before they were recorded has none.
std::vector<KernelPlan::Measurement> measurements_of(const nlohmann::json& j, const std::string& path) {
  std::vector<KernelPlan::Measurement> out;
  const auto list = j.find("measurements");
  if (list == j.end()) return out;
  const std::string who = "[kernel plan] " + path + ": ";
  if (!list->is_array()) throw ValueError(who + "\"measurements\" is not a list");
  for (std::size_t i = 0; i < list->size(); ++i) {
    try {
      const nlohmann::json& m = (*list)[i];
      out.push_back(
          {m.at("site").get<std::string>(), m.at("problem").get<std::string>(), m.at("dtypes").get<std::string>()});
    } catch (const nlohmann::json::exception& e) {
      throw ValueError(who + "measurement " + std::to_string(i) +
                       " needs site, problem and dtypes (strings): " + e.what());
    }
  }
  return out;
}

}  // namespace

void KernelPlan::merge(const KernelPlan& other) {
  for (const Kernel& k : other.kernels) {
    bool known = false;
    for (const Kernel& have : kernels)
      known = known || (have.op == k.op && have.dtypes == k.dtypes && have.variant == k.variant && have.source == k.source);
    if (!known) kernels.push_back(k);
  }
  steps.insert(steps.end(), other.steps.begin(), other.steps.end());
  for (const Measurement& m : other.measurements)
    if (std::find(measurements.begin(), measurements.end(), m) == measurements.end()) measurements.push_back(m);
}

void KernelPlan::save(const std::string& path) const {
  nlohmann::json list = nlohmann::json::array();
  for (const Kernel& k : kernels) {
    nlohmann::json j{{"op", k.op}, {"dtypes", k.dtypes}, {"variant", k.variant}};
    if (!k.label.empty()) j["label"] = k.label;
    if (k.late) j["late"] = true;
    j["source"] = k.source;
    list.push_back(std::move(j));
  }
  nlohmann::json step_list = nlohmann::json::array();
  for (const Step& s : steps) {
    nlohmann::json groups = nlohmann::json::array();
    for (const Group& g : s.groups) {
      nlohmann::json j{{"ops", g.ops}, {"shape", g.shape}, {"result", g.result}};
      if (!g.ended.empty()) j["ended"] = g.ended;
      groups.push_back(std::move(j));
    }
    step_list.push_back({{"signature", s.signature}, {"groups", std::move(groups)}});
  }
  nlohmann::json measured = nlohmann::json::array();
  for (const Measurement& m : measurements)
    measured.push_back({{"site", m.site}, {"problem", m.problem}, {"dtypes", m.dtypes}});
  io::write_file_atomically(
      path,
      nlohmann::json{
          {"kiln_kernel_plan", kPlanFormat}, {"kernels", list}, {"steps", step_list}, {"measurements", measured}}
              .dump(1) +
          "\n");
}

KernelPlan KernelPlan::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(path, 0, "a readable kernel plan file");
  std::ostringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) throw IoError(path, 0, "a readable kernel plan file");
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw ValueError("[kernel plan] " + path + " is not JSON: a plan is written by plan_kernels or mnist-train --kernel-plan");
  const auto format = j.find("kiln_kernel_plan");
  if (format == j.end() || !format->is_number_integer())
    throw ValueError("[kernel plan] " + path + " has no \"kiln_kernel_plan\" format number: not a kernel plan");
  if (format->get<int>() != kPlanFormat)
    throw ValueError("[kernel plan] " + path + " has format " + std::to_string(format->get<int>()) + "; this kiln reads " +
                     std::to_string(kPlanFormat));
  const auto list = j.find("kernels");
  if (list == j.end() || !list->is_array()) throw ValueError("[kernel plan] " + path + " has no \"kernels\" list");
  KernelPlan plan;
  for (std::size_t i = 0; i < list->size(); ++i) plan.kernels.push_back(kernel_of((*list)[i], path, i));
  plan.steps = steps_of(j, path);
  plan.measurements = measurements_of(j, path);
  return plan;
}

}  // namespace kiln
