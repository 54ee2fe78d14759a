// kiln_difftest: runs every registry op over the cases of difftest_cases.h on one device
// and writes inputs, outputs, cotangents and input gradients to safetensors shards plus
// manifest.json, which tools/difftest/torch_difftest.py replays in PyTorch.
//
//   kiln_difftest --device cuda --out difftest-out [--ops add,matmul] [--list]
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "difftest_cases.h"
#include "kiln/io/safetensors.h"

namespace {

using namespace difftest;
using Json = nlohmann::ordered_json;

// Non-finite doubles as strings, which JSON lacks.
Json number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

// Typed attrs, so Python tells an integer 2 from a float 2.0: {"name": {"t": kind, "v": value}}.
Json attrs_json(const Attrs& attrs) {
  Json r = Json::object();
  for (const auto& [k, v] : attrs.items()) {
    r[k] = std::visit(
        [](const auto& x) -> Json {
          using X = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<X, bool>)
            return {{"t", "bool"}, {"v", x}};
          else if constexpr (std::is_same_v<X, std::int64_t>)
            return {{"t", "int"}, {"v", x}};
          else if constexpr (std::is_same_v<X, double>)
            return {{"t", "float"}, {"v", number(x)}};
          else if constexpr (std::is_same_v<X, kiln::Scalar>) {
            if (x.is_floating()) return {{"t", "float"}, {"v", number(x.to_double())}};
            if (x.is_bool()) return {{"t", "bool"}, {"v", x.to_bool()}};
            return {{"t", "int"}, {"v", x.to_int()}};
          } else if constexpr (std::is_same_v<X, DType>)
            return {{"t", "dtype"}, {"v", kiln::dtype_name(x)}};
          else if constexpr (std::is_same_v<X, kiln::Device>)
            return {{"t", "device"}, {"v", x.is_cpu() ? "cpu" : "cuda"}};
          else if constexpr (std::is_same_v<X, std::vector<std::int64_t>>)
            return {{"t", "ints"}, {"v", x}};
          else
            return {{"t", "str"}, {"v", x}};
        },
        v);
  }
  return r;
}

// Safetensors shards of about 32 MiB, named in the manifest per case.
class Shards {
 public:
  explicit Shards(std::filesystem::path dir) : dir_(std::move(dir)) {}
  std::string add(const std::string& name, const Tensor& t) {
    pending_.push_back({name, t.detach().to(kiln::Device::cpu()).contiguous()});
    bytes_ += static_cast<std::size_t>(t.numel()) * kiln::dtype_size(t.dtype());
    return file_name();
  }
  void end_case() {
    if (bytes_ > (32u << 20)) flush();
  }
  void flush() {
    if (pending_.empty()) return;
    kiln::io::save_safetensors((dir_ / file_name()).string(), pending_);
    pending_.clear();
    bytes_ = 0;
    ++index_;
  }
  std::string file_name() const {
    char buf[32];
    std::snprintf(buf, sizeof buf, "cases-%03d.safetensors", index_);
    return buf;
  }

 private:
  std::filesystem::path dir_;
  kiln::nn::NamedTensors pending_;
  std::size_t bytes_ = 0;
  int index_ = 0;
};

struct Result {
  std::vector<Input> inputs;
  std::vector<Tensor> outputs, cotangents;
  std::vector<bool> wants_grad;  // per input: a leaf that requires grad
  std::vector<Tensor> grads;     // per input after backward; undefined where none flowed
};

// Runs one case: inputs viewed as the plan says on `dev`, the op, then backward with a
// seeded cotangent when the op has a vjp and a floating input.
Result run_case(const kiln::OpDef& op, const Case& c, kiln::Device dev, std::uint64_t seed) {
  kiln::Generator gen(seed);
  Result r{make_inputs(op, c, gen), {}, {}, {}, {}};
  std::vector<Tensor> leaves;
  bool any_grad = false;
  for (std::size_t i = 0; i < r.inputs.size(); ++i) {
    const Input& in = r.inputs[i];
    Tensor base = in.base.to(dev);
    Tensor t = in.is_view ? kiln::make_view(base, c.inputs[i].shape, in.plan.strides, in.plan.offset) : base;
    if (op.vjp && kiln::is_floating(t.dtype()) && !c.inputs[i].index_like) {
      t.requires_grad_();
      any_grad = true;
    }
    r.wants_grad.push_back(t.requires_grad());
    leaves.push_back(t);
  }
  r.outputs = kiln::dispatch(op, leaves, c.attrs);
  if (!any_grad) return r;
  std::vector<Tensor> roots;
  for (const Tensor& out : r.outputs) {
    Tensor cot;
    if (kiln::is_floating(out.dtype()) && out.requires_grad()) {
      cot = kiln::randn(out.shape(), {.dtype = DType::f64}, &gen).to(out.dtype());
      roots.push_back(out);
    }
    r.cotangents.push_back(cot);
  }
  if (roots.empty()) {
    r.wants_grad.assign(r.inputs.size(), false);
    return r;
  }
  std::vector<Tensor> cots;
  for (const Tensor& t : r.cotangents)
    if (t.defined()) cots.push_back(t.to(dev));
  kiln::backward(roots, cots);
  for (const Tensor& leaf : leaves) r.grads.push_back(leaf.requires_grad() ? leaf.grad() : Tensor());
  return r;
}

// Indices, labels and hinted inputs (a where condition): not the case's values.
bool is_index(const kiln::OpDef& op, const Case& c, std::size_t i) {
  const InputSpec& s = c.inputs[i];
  return s.index_like || s.low < s.high || consistency::hint_dtype(op.test, i).has_value();
}

Json case_json(const std::string& id, const std::string& file, const kiln::OpDef& op, const Case& c, const Result& r) {
  Json inputs = Json::array(), outputs = Json::array();
  for (std::size_t i = 0; i < r.inputs.size(); ++i) {
    const Input& in = r.inputs[i];
    Json j{{"dtype", kiln::dtype_name(in.base.dtype())},
           {"shape", c.inputs[i].shape},
           {"edge", in.edge},
           {"index", is_index(op, c, i)},
           {"grad", static_cast<bool>(r.wants_grad[i])}};
    if (in.is_view)
      j["view"] = {{"strides", in.plan.strides},
                   {"offset", in.plan.offset},
                   {"layout", consistency::layout_name(c.inputs[i].layout)}};
    inputs.push_back(j);
  }
  for (std::size_t k = 0; k < r.outputs.size(); ++k)
    outputs.push_back({{"dtype", kiln::dtype_name(r.outputs[k].dtype())},
                       {"shape", r.outputs[k].shape()},
                       {"cotangent", k < r.cotangents.size() && r.cotangents[k].defined()}});
  return {{"id", id},
          {"file", file},
          {"op", op.name},
          {"name", c.name},
          {"dtype", kiln::dtype_name(c.dtype)},
          {"values", values_name(c.values)},
          {"attrs", attrs_json(c.attrs)},
          {"tolerance_scale", op.test.tolerance_scale},
          {"inputs", inputs},
          {"outputs", outputs}};
}

std::set<std::string> split_list(const std::string& s) {
  std::set<std::string> r;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) r.insert(item);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Dumps every registry op's values and gradients for tools/difftest/torch_difftest.py"};
  std::string device = "cpu", out_dir = "difftest-out", ops_filter;
  bool list = false;
  std::uint64_t seed = 20240601;
  app.add_option("--device", device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--out", out_dir, "output directory (manifest.json and cases-*.safetensors)");
  app.add_option("--ops", ops_filter, "comma-separated op names (default: every op)");
  app.add_option("--seed", seed, "base seed of the input values and cotangents");
  app.add_flag("--list", list, "print each op, its dtypes and its number of cases, and exit");
  CLI11_PARSE(app, argc, argv);

  try {
    const kiln::Device dev = device == "cuda" ? kiln::Device::cuda(0) : kiln::Device::cpu();
    const std::set<std::string> only = split_list(ops_filter);
    for (const std::string& name : only) (void)kiln::get_op(name);  // an unknown name is a ValueError
    if (!list) std::filesystem::create_directories(out_dir);
    Shards shards(out_dir);
    Json manifest{{"device", device}, {"ops", Json::object()}};
    std::size_t n_cases = 0, n_rejected = 0;
    for (const kiln::OpDef* op : kiln::registered_ops()) {
      if (!only.empty() && !only.count(op->name)) continue;
      const std::vector<Case> cases = make_cases(*op);
      if (list) {
        std::cout << op->name << " inputs=" << op->num_inputs << " dtypes=[" << kiln::dtypes_str(op->dtypes)
                  << "] vjp=" << (op->vjp ? 1 : 0) << " cases=" << cases.size() << "\n";
        continue;
      }
      Json done = Json::array(), rejected = Json::array();
      for (const Case& c : cases) {
        char id[32];
        std::snprintf(id, sizeof id, "case%05zu", n_cases);
        try {
          const Result r = run_case(*op, c, dev, seed + n_cases);
          std::string file;
          for (std::size_t i = 0; i < r.inputs.size(); ++i)
            file = shards.add(id + (".in" + std::to_string(i)), r.inputs[i].base);
          for (std::size_t k = 0; k < r.outputs.size(); ++k) {
            file = shards.add(id + (".out" + std::to_string(k)), r.outputs[k]);
            if (k < r.cotangents.size() && r.cotangents[k].defined())
              shards.add(id + (".cot" + std::to_string(k)), r.cotangents[k]);
          }
          for (std::size_t i = 0; i < r.grads.size(); ++i) {
            if (!r.wants_grad[i]) continue;
            const Input& in = r.inputs[i];
            Tensor g = r.grads[i].defined() ? r.grads[i] : kiln::zeros(c.inputs[i].shape, {.dtype = in.base.dtype()});
            shards.add(id + (".grad" + std::to_string(i)), g);
          }
          done.push_back(case_json(id, file, *op, c, r));
          shards.end_case();
          ++n_cases;
        } catch (const kiln::Error& e) {
          // Attrs or shapes this op does not take (a 0-d input to an index op, axes past
          // the rank): listed so the comparison can show what was not run.
          rejected.push_back({{"name", c.name}, {"error", std::string(e.what()).substr(0, 300)}});
          ++n_rejected;
        }
      }
      manifest["ops"][op->name] = {{"vjp", static_cast<bool>(op->vjp)}, {"cases", done}, {"rejected", rejected}};
    }
    if (list) return 0;
    shards.flush();
    std::ofstream(std::filesystem::path(out_dir) / "manifest.json") << manifest.dump() << "\n";
    std::cout << "kiln_difftest: " << n_cases << " cases written to " << out_dir << " (" << n_rejected
              << " rejected by kiln's shape or dtype rules)\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "kiln_difftest: " << e.what() << "\n";
    return 1;
  }
}
