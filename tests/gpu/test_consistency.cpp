// The registry-driven consistency suite (ggml's test-backend-ops, for kiln): every op in
// registered_ops() x every dtype it supports x its TestHints attrs sets x input shapes
// (0-d, [1], [128,2,2,2], [5,7,11,13], transposed and step-sliced views, broadcasting
// pairs, a NaN/Inf case) runs on the CPU and on cuda:0 from the same inputs, and the GPU
// outputs must match the CPU reference (consistency_compare.h). Cases are generated from
// the OpDef alone (consistency_cases.h), so new ops are covered by registering them.
//
//   KILN_TEST_OPS=add,mul ./gpu_tests -tc='consistency*'   only these ops (KILN_OPS works too)
//   KILN_SKIP_OPS=gather,scatter_add                       all but these
//   KILN_CONSISTENCY_VERBOSE=1                             each case's name before it runs, then its result
//
// A case the CPU rejects with a typed kiln::Error (attrs that do not fit a shape, say) is
// skipped, and the GPU must throw the same type, except a ValueError about input values
// (an index out of range), which the GPU cannot raise without a sync. Ops without a GPU
// implementation are listed as CPU-only, ops whose every case the CPU rejected as needing
// hints. Inputs that are not "the case's dtype in the op's range" (labels, indices, bool
// conditions) come from TestHints fields `inputs` (per input: optional dtype, low/high) and
// `shapes` (explicit input shape sets) when registry.h has them (detected at compile time);
// otherwise consistency_cases.h finds such an input by trying bool and i64 in its place.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "consistency_cases.h"
#include "consistency_compare.h"

using namespace kiln;
using namespace consistency;

namespace {

std::set<std::string> op_list(const char* var, const char* alt = nullptr) {
  const char* env = std::getenv(var);
  if ((!env || !*env) && alt) env = std::getenv(alt);
  std::set<std::string> ops;
  if (!env) return ops;
  std::stringstream list(env);
  for (std::string item; std::getline(list, item, ',');)
    if (!item.empty()) ops.insert(item);
  return ops;
}

const char* error_kind(const std::exception& e) {
  if (dynamic_cast<const ShapeError*>(&e)) return "ShapeError";
  if (dynamic_cast<const DTypeError*>(&e)) return "DTypeError";
  if (dynamic_cast<const DeviceError*>(&e)) return "DeviceError";
  if (dynamic_cast<const ValueError*>(&e)) return "ValueError";
  if (dynamic_cast<const CompileError*>(&e)) return "CompileError";
  if (dynamic_cast<const CudaError*>(&e)) return "CudaError";
  if (dynamic_cast<const Error*>(&e)) return "kiln::Error";
  return "std::exception";
}

// Stable across runs and platforms, unlike std::hash.
std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

enum class Outcome { passed, failed, skipped, value_checked };
const char* const kOutcomeNames[] = {"PASS", "FAIL", "SKIP", "SKIP"};
struct Result {
  Outcome outcome;
  std::string detail;
};

Result run_case(const OpDef& op, const Case& c, Device gpu) {
  Generator gen(fnv1a(c.name));
  std::vector<Tensor> in_cpu, in_gpu;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    InputPair p = make_input(c.inputs[i], c.dtype, op.test, c.special, static_cast<int>(i), gen, gpu);
    in_cpu.push_back(p.cpu);
    in_gpu.push_back(p.gpu);
  }
  Attrs cpu_attrs = c.attrs, gpu_attrs = c.attrs;
  if (op.num_inputs == 0) {
    cpu_attrs.set("device", Device::cpu());
    gpu_attrs.set("device", gpu);
  }

  std::vector<Tensor> ref;
  std::string cpu_error;
  try {
    ref = dispatch(op, in_cpu, cpu_attrs);
  } catch (const Error& e) {
    cpu_error = std::string(error_kind(e)) + ": " + e.what();
  }
  std::vector<Tensor> out;
  try {
    out = dispatch(op, in_gpu, gpu_attrs);
    if (!cpu_error.empty()) {
      // Make sure the GPU really succeeded before judging it (errors surface at sync).
      for (const Tensor& t : out)
        if (t.defined()) (void)t.to(Device::cpu());
      // Checks of input values (an index out of range) need a sync the GPU path must not make.
      if (cpu_error.rfind("ValueError", 0) == 0) return {Outcome::value_checked, cpu_error};
      return {Outcome::failed, "the CPU threw " + cpu_error + " but the GPU did not"};
    }
  } catch (const std::exception& e) {
    if (cpu_error.empty()) return {Outcome::failed, "the GPU threw " + std::string(error_kind(e)) + ": " + e.what()};
    if (cpu_error.rfind(error_kind(e), 0) != 0)
      return {Outcome::failed, "the CPU threw " + cpu_error + ", the GPU " + error_kind(e) + ": " + e.what()};
    return {Outcome::skipped, cpu_error};
  }
  if (out.size() != ref.size()) return {Outcome::failed, "output counts differ"};
  std::string diff;
  try {
    for (std::size_t k = 0; k < out.size(); ++k) {
      const bool tf32 = op.test.tf32 && c.dtype == DType::f32 && allow_conv_tf32();
      const double scale = op.test.tolerance_scale * (tf32 ? tolerance(DType::bf16) / tolerance(DType::f32) : 1.0);
      std::string d = compare_outputs(ref[k], out[k], 8, scale);
      if (!d.empty()) diff += "\n  output " + std::to_string(k) + ": " + d;
    }
  } catch (const std::exception& e) {
    return {Outcome::failed, "reading the GPU output threw " + std::string(error_kind(e)) + ": " + e.what()};
  }
  return diff.empty() ? Result{Outcome::passed, ""} : Result{Outcome::failed, diff};
}

}  // namespace

TEST_CASE("consistency: every registered op on the GPU matches its CPU reference") {
  const Device gpu = Device::cuda(0);
  const std::set<std::string> filter = op_list("KILN_TEST_OPS", "KILN_OPS"), skip = op_list("KILN_SKIP_OPS");
  const bool verbose = std::getenv("KILN_CONSISTENCY_VERBOSE") != nullptr;
  constexpr int kMaxReported = 100;

  std::int64_t total = 0, passed = 0, failed = 0, skipped = 0, value_checked = 0;
  std::vector<std::string> cpu_only, unknown, unexercised;
  std::map<std::string, int> failures_by_op;
  for (const std::string& name : filter)
    if (!find_op(name)) unknown.push_back(name);
  CHECK_MESSAGE(unknown.empty(), "unknown ops in KILN_TEST_OPS");

  for (const OpDef* op : registered_ops()) {
    if ((!filter.empty() && !filter.count(op->name)) || skip.count(op->name)) continue;
    if (!op->gpu) {
      cpu_only.push_back(op->name);
      continue;
    }
    std::int64_t ran = 0;  // cases the CPU accepted
    for (const Case& c : make_cases(*op)) {
      ++total;
      if (verbose) {
        std::printf("RUN  %s\n", c.name.c_str());  // a crash names its case
        std::fflush(stdout);
      }
      Result r;
      try {
        r = run_case(*op, c, gpu);
      } catch (const std::exception& e) {
        r = {Outcome::failed, std::string("building the inputs threw ") + error_kind(e) + ": " + e.what()};
      }
      if (r.outcome == Outcome::passed || r.outcome == Outcome::failed) ++ran;
      if (r.outcome == Outcome::passed) ++passed;
      if (r.outcome == Outcome::skipped) ++skipped;
      if (r.outcome == Outcome::value_checked) ++value_checked;
      if (r.outcome == Outcome::failed) {
        ++failed;
        ++failures_by_op[op->name];
        if (failed <= kMaxReported) FAIL_CHECK(c.name << ": " << r.detail);
      }
      if (verbose)
        std::printf("%s %s%s\n", kOutcomeNames[static_cast<int>(r.outcome)], c.name.c_str(),
                    r.outcome == Outcome::passed ? "" : ("  (" + r.detail + ")").c_str());
    }
    if (ran == 0) unexercised.push_back(op->name);
  }

  std::string by_op, cpu_list, idle_list;
  for (const std::string& n : unexercised) idle_list += " " + n;
  for (const auto& [name, n] : failures_by_op) by_op += " " + name + ":" + std::to_string(n);
  for (const std::string& n : cpu_only) cpu_list += " " + n;
  std::printf(
      "consistency: %lld cases, %lld passed, %lld failed, %lld skipped (both devices reject the inputs), "
      "%lld skipped (input values only the CPU checks)\n",
      static_cast<long long>(total), static_cast<long long>(passed), static_cast<long long>(failed),
      static_cast<long long>(skipped), static_cast<long long>(value_checked));
  if (!by_op.empty()) std::printf("consistency: failures by op:%s\n", by_op.c_str());
  std::printf("consistency: CPU-only ops (no GPU implementation, not run):%s\n",
              cpu_list.empty() ? " none" : cpu_list.c_str());
  // Not a failure here: such an op needs TestHints (explicit shapes, index dtypes) to be exercised.
  if (!idle_list.empty())
    std::printf("consistency: ops whose every case the CPU rejected (need TestHints):%s\n", idle_list.c_str());
  std::fflush(stdout);
  CHECK(failed == 0);
  CHECK(total + static_cast<std::int64_t>(cpu_only.size()) > 0);
}
