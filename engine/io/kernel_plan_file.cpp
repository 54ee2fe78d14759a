// KernelPlan's file: JSON, so a plan can be read and edited by hand; written atomically.
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

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
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(who + "needs op, dtypes (strings) and variant (a number): " + e.what());
  }
  if (out.op.empty() || out.dtypes.empty()) throw ValueError(who + "has an empty op or dtypes");
  if (!out.label.empty() && out.source.empty())
    throw ValueError(who + "(" + out.label + ") is generated but has no source to rebuild it from");
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
}

void KernelPlan::save(const std::string& path) const {
  nlohmann::json list = nlohmann::json::array();
  for (const Kernel& k : kernels) {
    nlohmann::json j{{"op", k.op}, {"dtypes", k.dtypes}, {"variant", k.variant}};
    if (!k.label.empty()) j["label"] = k.label;
    j["source"] = k.source;
    list.push_back(std::move(j));
  }
  io::write_file_atomically(path, nlohmann::json{{"kiln_kernel_plan", kPlanFormat}, {"kernels", list}}.dump(1) + "\n");
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
  return plan;
}

}  // namespace kiln
