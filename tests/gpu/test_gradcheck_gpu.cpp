// Gradients on the GPU for every differentiable op in the registry:
//  - backward on cuda:0 against central finite differences in f64 (gradcheck_op with a device);
//  - backward on cuda:0 against backward on the CPU from the same inputs and cotangents,
//    in f64 and f32, including a transposed-view case.
// KILN_TEST_OPS=add,mul limits the ops and KILN_SKIP_OPS=a,b leaves some out, as in test_consistency.cpp.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "consistency_cases.h"
#include "consistency_compare.h"
#include "gradcheck.h"

using namespace kiln;
using namespace consistency;

namespace {

bool listed(const char* env, const std::string& op) {
  std::stringstream list(env);
  for (std::string item; std::getline(list, item, ',');)
    if (item == op) return true;
  return false;
}

bool selected(const std::string& op) {
  const char* skip = std::getenv("KILN_SKIP_OPS");
  if (skip && listed(skip, op)) return false;
  const char* env = std::getenv("KILN_TEST_OPS");
  if (!env || !*env) env = std::getenv("KILN_OPS");
  return !env || !*env || listed(env, op);
}

bool differentiable_on_gpu(const OpDef& op) { return op.vjp && op.gpu && op.num_inputs != 0; }

bool supports(const OpDef& op, DType dt) {
  return op.dtypes.empty() || std::find(op.dtypes.begin(), op.dtypes.end(), dt) != op.dtypes.end();
}

// Leaf gradients of `op` at `inputs` for cotangents drawn from `seed` (on the CPU, then
// moved to the outputs' device so both devices see the same numbers).
std::vector<Tensor> grads_of(const OpDef& op, std::vector<Tensor> inputs, const Attrs& attrs, std::uint64_t seed) {
  for (Tensor& t : inputs)
    if (is_floating(t.dtype())) t.requires_grad_();
  std::vector<Tensor> outs = dispatch(op, inputs, attrs);
  Generator gen(seed);
  std::vector<Tensor> roots, cots;
  for (const Tensor& o : outs) {
    Tensor c = randn(o.shape(), {.dtype = DType::f64}, &gen);
    if (!o.requires_grad()) continue;
    roots.push_back(o);
    cots.push_back(c.to(o.dtype()).to(o.device()));
  }
  if (roots.empty()) return {};
  backward(roots, cots);
  std::vector<Tensor> g;
  for (const Tensor& t : inputs) g.push_back(t.requires_grad() ? t.grad() : Tensor());
  return g;
}

}  // namespace

TEST_CASE("gradcheck on the GPU: backward against finite differences in f64 for every differentiable op") {
  int checked = 0, failed_ops = 0;
  std::string skipped;
  for (const OpDef* op : registered_ops()) {
    if (!selected(op->name) || !differentiable_on_gpu(*op)) continue;
    if (!op->test.gradcheck || !supports(*op, DType::f64) || op->num_inputs < 0) {
      skipped += " " + op->name;
      continue;
    }
    ++checked;
    std::vector<std::string> failures = testing::gradcheck_op(*op, Device::cuda(0));
    if (!failures.empty()) ++failed_ops;
    for (const std::string& f : failures) FAIL_CHECK("[gpu] " << f);
  }
  std::printf("gradcheck_gpu: %d ops checked, %d failed; not checked (no f64, variadic or gradcheck=false):%s\n",
              checked, failed_ops, skipped.empty() ? " none" : skipped.c_str());
  CHECK(failed_ops == 0);
}

TEST_CASE("GPU backward matches CPU backward for every differentiable op") {
  std::int64_t cases = 0, failed = 0, skipped = 0;
  for (const OpDef* op : registered_ops()) {
    if (!selected(op->name) || !differentiable_on_gpu(*op)) continue;
    const int n = op->num_inputs < 0 ? 2 : op->num_inputs;
    std::vector<std::vector<InputSpec>> sets;
    for (const auto& shapes : hint_shapes(op->test)) {
      std::vector<InputSpec> set;
      for (const Shape& s : shapes) set.push_back({s});
      sets.push_back(set);
    }
    if (sets.empty()) {
      for (const auto& shapes : testing::gradcheck_shapes(n, op->test.same_shape_inputs)) {
        std::vector<InputSpec> set;
        for (const Shape& s : shapes) set.push_back({s});
        sets.push_back(set);
      }
      sets.push_back(std::vector<InputSpec>(static_cast<std::size_t>(n), {Shape{5, 7, 11, 13}, Layout::transposed}));
    }
    bool hinted_dtypes = false;
    for (auto& set : sets)
      for (std::size_t i = 0; i < set.size(); ++i) {
        set[i].dtype = hint_dtype(op->test, i);
        std::tie(set[i].low, set[i].high) = hint_range(op->test, i);
        hinted_dtypes = hinted_dtypes || set[i].dtype.has_value();
      }

    for (DType dt : {DType::f64, DType::f32}) {
      if (!supports(*op, dt)) continue;
      for (const Attrs& attrs : op->test.attrs) {
        std::vector<std::vector<InputSpec>> these = sets;
        if (!hinted_dtypes) apply_special_input(*op, attrs, these);  // bool conditions, indices
        for (const auto& set : these) {
          const std::string name = "backward " + case_name(op->name, dt, set, attrs, false, op->num_inputs < 0);
          ++cases;
          try {
            Generator gen(1000 + static_cast<std::uint64_t>(cases));
            std::vector<Tensor> in_cpu, in_gpu;
            for (std::size_t i = 0; i < set.size(); ++i) {
              InputPair p = make_input(set[i], dt, op->test, false, static_cast<int>(i), gen, Device::cuda(0));
              in_cpu.push_back(p.cpu);
              in_gpu.push_back(p.gpu);
            }
            std::vector<Tensor> g_cpu;
            try {
              g_cpu = grads_of(*op, in_cpu, attrs, 77);
            } catch (const Error&) {
              ++skipped;  // these attrs/shapes do not apply; the consistency suite checks the GPU agrees
              continue;
            }
            std::vector<Tensor> g_gpu = grads_of(*op, in_gpu, attrs, 77);
            REQUIRE(g_gpu.size() == g_cpu.size());
            std::string diff;
            for (std::size_t i = 0; i < g_cpu.size(); ++i) {
              // Backward chains several ops; allow ten times the forward tolerance in f32, and
              // bf16's where f32 runs on TF32 tensor cores (as the consistency suite does).
              const bool tf32 = op->test.tf32 && dt == DType::f32 && allow_conv_tf32();
              const double scale = tf32 ? tolerance(DType::bf16) / tolerance(DType::f32) : dt == DType::f32 ? 10.0 : 1.0;
              std::string d = compare_outputs(g_cpu[i], g_gpu[i], 8, scale);
              if (!d.empty()) diff += "\n  grad of input " + std::to_string(i) + ": " + d;
            }
            if (!diff.empty()) {
              ++failed;
              FAIL_CHECK(name << diff);
            }
          } catch (const std::exception& e) {
            ++failed;
            FAIL_CHECK(name << ": threw " << e.what());
          }
        }
      }
    }
  }
  std::printf("backward_gpu_vs_cpu: %lld cases, %lld passed, %lld failed, %lld skipped (CPU rejects)\n",
              static_cast<long long>(cases), static_cast<long long>(cases - failed - skipped),
              static_cast<long long>(failed), static_cast<long long>(skipped));
  CHECK(failed == 0);
}
