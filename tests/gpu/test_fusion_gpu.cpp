// Pointwise fusion in compiled steps: random chains of the registry's pointwise ops, fused,
// give the same bits as the same ops run one by one, in fewer kernels.
#include <doctest/doctest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/registry.h"
#include "kiln/kiln.h"
#include "kiln/runtime/disk_cache.h"
#include "process.h"
#include "temp_dir.h"

using namespace kiln;

namespace {

const Device kGpu = Device::cuda(0);

// Pointwise ops whose output has their input dtype and that need no attrs.
std::vector<const OpDef*> chain_ops(int arity) {
  std::vector<const OpDef*> out;
  for (const OpDef* op : registered_ops()) {
    const PointwiseExpr* pw = pointwise_expr(*op);
    if (!pw || op->num_inputs != arity || pw->params) continue;
    if (pw->domain != kernels::PointwiseDomain::numeric && pw->domain != kernels::PointwiseDomain::floating) continue;
    out.push_back(op);
  }
  return out;
}

std::vector<std::uint64_t> bits(const Tensor& t) {
  const std::vector<double> v = t.to(Device::cpu()).to(DType::f64).to_vector<double>();
  std::vector<std::uint64_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(double));
  return b;
}

}  // namespace

TEST_CASE("fusion: random pointwise chains match the unfused ops bit for bit in fewer kernels") {
  const std::vector<const OpDef*> unary = chain_ops(1), binary = chain_ops(2);
  REQUIRE(unary.size() > 5);
  REQUIRE(binary.size() > 3);
  std::mt19937 rng(2024);
  for (int trial = 0; trial < 40; ++trial) {
    const DType dt = trial % 2 ? DType::f64 : DType::f32;
    const int length = 2 + static_cast<int>(rng() % 7);
    std::vector<int> picks;
    for (int i = 0; i < length; ++i) picks.push_back(static_cast<int>(rng() % 1000));
    Generator g(static_cast<std::uint64_t>(trial));
    const Tensor x = randn({33, 17}, {.dtype = dt}, &g).to(kGpu);
    const Tensor row = randn({1, 17}, {.dtype = dt}, &g).to(kGpu);                 // broadcast
    const Tensor xt = transpose(randn({17, 33}, {.dtype = dt}, &g).to(kGpu), 0, 1);  // strided
    std::string names;
    auto fn = [&](const std::vector<Tensor>& in) {
      std::vector<Tensor> values{in[0], in[1], in[2]};
      names.clear();
      for (int i = 0; i < length; ++i) {
        const int r = picks[static_cast<std::size_t>(i)];
        const Tensor& last = values.back();
        if (r % 3 == 0) {
          const OpDef& op = *binary[static_cast<std::size_t>(r / 3) % binary.size()];
          values.push_back(call(op, {last, values[static_cast<std::size_t>(r / 7) % values.size()]}));
          names += op.name + " ";
        } else {
          const OpDef& op = *unary[static_cast<std::size_t>(r) % unary.size()];
          values.push_back(call(op, {last}));
          names += op.name + " ";
        }
      }
      return std::vector<Tensor>{values.back(), values[values.size() / 2 + 1]};
    };
    CompiledFunction fused = compile(fn, {.fuse = true}), plain = compile(fn);
    std::vector<Tensor> a, b;
    for (int call_no = 0; call_no < 3; ++call_no) {  // eager, capture, replay
      a = fused({x, row, xt});
      b = plain({x, row, xt});
    }
    const std::vector<Tensor> want = fn({x, row, xt});
    CAPTURE(trial);
    CAPTURE(names);
    for (std::size_t k = 0; k < want.size(); ++k) {
      CHECK(bits(a[k]) == bits(want[k]));
      CHECK(bits(b[k]) == bits(want[k]));
    }
    CHECK(fused.stats().kernels_per_graph.at(0) <= plain.stats().kernels_per_graph.at(0));
    if (trial == 0) CHECK(fused.stats().kernels_per_graph.at(0) < plain.stats().kernels_per_graph.at(0));
  }
}

TEST_CASE("fusion: a value read outside its group is written; a dropped one is not needed") {
  Generator g(3);
  const Tensor x = randn({64, 32}, {}, &g).to(kGpu), bias = randn({32}, {}, &g).to(kGpu);
  Tensor kept;
  auto fn = [&](const std::vector<Tensor>& in) {
    kept = add(in[0], in[1]);  // held by the caller: written
    Tensor y = relu(mul(kept, kept));
    return std::vector<Tensor>{sigmoid(y)};
  };
  CompiledFunction cf = compile(fn, {.fuse = true});
  for (int i = 0; i < 3; ++i) {
    const Tensor out = cf({x, bias})[0];
    const Tensor want = sigmoid(relu(mul(add(x, bias), add(x, bias))));
    CHECK(bits(out) == bits(want));
    CHECK(bits(kept) == bits(add(x, bias)));
  }
  CHECK(cf.stats().kernels_per_graph.at(0) <= 2);  // the input copy and one fused kernel
}

// kiln_test_helper fused-steps runs two compiled, fused steps; a second process, meeting them in
// the other order, must find every kernel (the generated ones too) in the disk cache.
TEST_CASE("fusion: a second process runs the same fused steps in another order and compiles nothing") {
  kiln_test::TempDir dir;
  const kiln_test::EnvOverrides env{{"KILN_CACHE", "rw"},
                                    {"KILN_CACHE_DIR", dir.path().string()},
                                    {"KILN_CACHE_MAX_SIZE", std::nullopt},
                                    {"KILN_NO_COMPILE", std::nullopt}};
  auto run = [&](const std::string& order) {
    const kiln_test::ProcessResult r = kiln_test::run_process({KILN_TEST_HELPER_PATH, "fused-steps", order}, env);
    INFO("fused-steps " << order << ": " << r.out << r.err);
    REQUIRE(r.exit_code == 0);
    return nlohmann::json::parse(r.out);
  };
  const nlohmann::json first = run("ab");
  CHECK(first.at("compiles").get<int>() > 0);
  std::set<std::string> labels;
  for (const rt::EntryInfo& e : rt::DiskCache(dir.path(), rt::CacheMode::read_only, 0).list()) labels.insert(e.key.label);
  CHECK(labels.count("fused(mul,add,relu) f32") == 1);
  CHECK(labels.count("fused(sigmoid,mul,tanh) f32") == 1);

  const nlohmann::json second = run("ba");
  CHECK(second.at("compiles") == 0);
  CHECK(second.at("disk_hits") == first.at("compiles"));
}
