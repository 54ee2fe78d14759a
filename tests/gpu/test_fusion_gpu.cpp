// Pointwise fusion in compiled steps: random chains of the registry's pointwise ops, fused,
// give the same bits as the same ops run one by one, in fewer kernels.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/registry.h"
#include "gpu_match.h"
#include "kiln/kiln.h"
#include "kiln/runtime/disk_cache.h"
#include "kiln/runtime/generated_kernels.h"
#include "log_capture.h"
#include "process.h"
#include "temp_dir.h"

using namespace kiln;

namespace {

using kiln_test::kGpu;

// Pointwise ops whose output has their input dtype and that need no attrs.
std::vector<const OpDef*> chain_ops(int arity) {
  std::vector<const OpDef*> out;
  for (const OpDef* op : registered_ops()) {
    const PointwiseExpr* pw = pointwise_expr(*op);
    if (!pw || op->num_inputs != arity || pw->params) continue;
    if (pw->domain != kernels::PointwiseDomain::numeric && pw->domain != kernels::PointwiseDomain::floating) continue;
    out.push_back(op);
  }
  // By name: the registry's order follows static initialisation, which changes with the build.
  std::sort(out.begin(), out.end(), [](const OpDef* a, const OpDef* b) { return a->name < b->name; });
  return out;
}

using kiln_test::f64_bits;

// The same bits (NaN for NaN) in every element; on a mismatch, how many and the first pair.
void check_same_bits(const Tensor& got, const Tensor& want, const char* what) {
  const std::vector<std::uint64_t> a = f64_bits(got), b = f64_bits(want);
  REQUIRE(a.size() == b.size());
  std::size_t first = a.size(), count = 0;
  for (std::size_t i = a.size(); i-- > 0;)
    if (a[i] != b[i]) first = i, ++count;
  if (count > 0) {
    double fa = 0, fb = 0;
    std::memcpy(&fa, &a[first], 8), std::memcpy(&fb, &b[first], 8);
    MESSAGE(std::string(what) << ": " << count << " of " << a.size() << " differ, the first at " << first << ": " << fa << " against "
                 << fb);
  }
  CHECK(count == 0);
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
    CompiledFunction fused = compile(fn, {.fuse = true}), plain = compile(fn, {.fuse = false});
    std::vector<Tensor> a, b;
    for (int call_no = 0; call_no < 3; ++call_no) {  // eager, capture, replay
      a = fused({x, row, xt});
      b = plain({x, row, xt});
    }
    const std::vector<Tensor> want = fn({x, row, xt});
    CAPTURE(trial);
    CAPTURE(names);
    for (std::size_t k = 0; k < want.size(); ++k) {
      CAPTURE(k);
      check_same_bits(a[k], want[k], "fused");
      check_same_bits(b[k], want[k], "plain");
    }
    CHECK(fused.stats().kernels_per_graph.at(0) <= plain.stats().kernels_per_graph.at(0));
    if (trial == 0) CHECK(fused.stats().kernels_per_graph.at(0) < plain.stats().kernels_per_graph.at(0));
  }
}

// ptxas contracts a plain multiply and add into an fma even across an empty asm barrier; one
// op's product and the next op's sum must each round, as they do in two kernels.
TEST_CASE("fusion: a product and the sum after it round apart, as two kernels do") {
  for (const DType dt : {DType::f32, DType::f64}) {
    Generator g(5);
    const Tensor a = randn({4096}, {.dtype = dt}, &g).to(kGpu), b = randn({4096}, {.dtype = dt}, &g).to(kGpu);
    const Tensor c = randn({4096}, {.dtype = dt}, &g).to(kGpu);
    auto fn = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{add(mul(in[0], in[1]), in[2])}; };
    CompiledFunction fused = compile(fn, {.fuse = true}), plain = compile(fn, {.fuse = false});
    Tensor got;
    for (int call_no = 0; call_no < 3; ++call_no) got = fused({a, b, c})[0], plain({a, b, c});
    CAPTURE(dtype_name(dt));
    CHECK(fused.stats().kernels_per_graph.at(0) < plain.stats().kernels_per_graph.at(0));
    check_same_bits(got, fn({a, b, c})[0], "fused");
  }
}

// A chain that once gave other NaN bits fused than unfused (NaNs from sqrt, through floor and
// gelu), with its second operand from each input: the plain input, a broadcast row, a strided view.
TEST_CASE("fusion: sqrt, sub, floor, gelu match the unfused ops bit for bit, NaN for NaN") {
  const char* names[] = {"sqrt", "sub", "floor", "gelu"};
  for (const DType dt : {DType::f64, DType::f32})
    for (int other = 0; other < 4; ++other) {
      Generator g(3);
      const Tensor x = randn({33, 17}, {.dtype = dt}, &g).to(kGpu);
      const Tensor row = randn({1, 17}, {.dtype = dt}, &g).to(kGpu);
      const Tensor xt = transpose(randn({17, 33}, {.dtype = dt}, &g).to(kGpu), 0, 1);
      auto fn = [&](const std::vector<Tensor>& in) {
        std::vector<Tensor> v{in[0], in[1], in[2]};
        for (const char* name : names) {
          const OpDef& op = *find_op(name);
          v.push_back(op.num_inputs == 1 ? call(op, {v.back()}) : call(op, {v.back(), v[static_cast<std::size_t>(other)]}));
        }
        return std::vector<Tensor>{v.back()};
      };
      CompiledFunction fused = compile(fn, {.fuse = true});
      Tensor got;
      for (int call_no = 0; call_no < 3; ++call_no) got = fused({x, row, xt})[0];  // eager, capture, replay
      CAPTURE(dtype_name(dt));
      CAPTURE(other);
      check_same_bits(got, fn({x, row, xt})[0], "fused");
    }
}

namespace {

constexpr DType kChainDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8};

// A random chain over values of several dtypes: unary and binary ops of the registry (numeric
// ones on any value, floating ones on floating values), casts, tensor-scalar ops and
// comparisons cast back, each on the last value or a value of its dtype.
struct MixedChain {
  std::vector<int> picks;
  std::string names;

  std::vector<Tensor> operator()(const std::vector<Tensor>& in) {
    static const std::vector<const OpDef*> unary = chain_ops(1), binary = chain_ops(2);
    std::vector<Tensor> values(in.begin(), in.end());
    names.clear();
    for (std::size_t i = 0; i < picks.size(); ++i) {
      const int r = picks[i];
      const Tensor last = values.back();
      const bool floating = is_floating(last.dtype());
      Tensor next;
      // The first op of `ops` from `start` on that takes last's dtype as it is.
      auto pick = [&](const std::vector<const OpDef*>& ops, std::size_t start) -> const OpDef* {
        for (std::size_t n = 0; n < ops.size(); ++n) {
          const OpDef* op = ops[(start + n) % ops.size()];
          const bool takes = std::find(op->dtypes.begin(), op->dtypes.end(), last.dtype()) != op->dtypes.end();
          if (takes && (floating || pointwise_expr(*op)->domain == kernels::PointwiseDomain::numeric)) return op;
        }
        return nullptr;
      };
      const OpDef* op = r % 6 == 3 ? pick(binary, static_cast<std::size_t>(r / 6)) : pick(unary, static_cast<std::size_t>(r / 6));
      switch (op || r % 6 == 0 || r % 6 >= 4 ? r % 6 : 0) {
        case 0: {
          const DType to = kChainDTypes[static_cast<std::size_t>(r / 6) % std::size(kChainDTypes)];
          next = cast(last, to);
          names += std::string("cast:") + std::string(dtype_name(to)) + " ";
          break;
        }
        case 1: case 2:
          next = call(*op, {last});
          names += op->name + " ";
          break;
        case 3: {
          Tensor other = last;
          for (std::size_t k = static_cast<std::size_t>(r) % values.size(), n = 0; n < values.size(); ++n, k = (k + 1) % values.size())
            if (values[k].dtype() == last.dtype()) {
              other = values[k];
              break;
            }
          next = call(*op, {last, other});
          names += op->name + "(v" + std::to_string(std::find_if(values.begin(), values.end(), [&](const Tensor& v) {
                     return v.impl() == other.impl();
                   }) - values.begin()) + ") ";
          break;
        }
        case 4: {
          const char* ops[] = {"add_scalar", "mul_scalar", "rsub_scalar", "sub_scalar"};
          const OpDef& op = get_op(ops[static_cast<std::size_t>(r / 6) % 4]);
          next = call(op, {last}, Attrs{{"scalar", r % 4 == 0 ? Scalar(3) : Scalar(-1.5)}});
          names += op.name + (r % 4 == 0 ? "(3) " : "(-1.5) ");
          break;
        }
        default:  // a mask, cast back: the pattern of ReLU's backward
          next = cast(gt(last, zeros({}, {.dtype = last.dtype(), .device = kGpu})), last.dtype());
          names += "gt cast ";
      }
      values.push_back(next);
    }
    return {values.back(), values[values.size() / 2 + 1]};
  }
};

}  // namespace

TEST_CASE("fusion: random chains in every dtype, casts and scalar ops included, match the unfused ops bit for bit") {
  std::mt19937 rng(77);
  for (int trial = 0; trial < 42; ++trial) {
    const DType dt = kChainDTypes[static_cast<std::size_t>(trial) % std::size(kChainDTypes)];
    MixedChain chain;
    const int length = 3 + static_cast<int>(rng() % 8);
    for (int i = 0; i < length; ++i) chain.picks.push_back(static_cast<int>(rng() % 600));
    Generator g(static_cast<std::uint64_t>(100 + trial));
    auto input = [&](Shape shape) { return cast(mul(randn(shape, {}, &g), 4.0), dt).to(kGpu); };
    const Tensor x = input({33, 17}), row = input({1, 17}), xt = transpose(input({17, 33}), 0, 1);
    CompiledFunction fused = compile(std::ref(chain), {.fuse = true}), plain = compile(std::ref(chain), {.fuse = false});
    std::vector<Tensor> a, b;
    for (int call_no = 0; call_no < 3; ++call_no) {  // eager, capture, replay
      a = fused({x, row, xt});
      b = plain({x, row, xt});
    }
    const std::vector<Tensor> want = chain({x, row, xt});
    CAPTURE(trial);
    CAPTURE(chain.names);
    for (std::size_t k = 0; k < want.size(); ++k) {
      CAPTURE(k);
      CHECK(a[k].dtype() == want[k].dtype());
      check_same_bits(a[k], want[k], "fused");
      check_same_bits(b[k], want[k], "plain");
    }
    CHECK(fused.stats().kernels_per_graph.at(0) <= plain.stats().kernels_per_graph.at(0));
  }
}

// Autocast's casts join the pointwise work beside them: a bf16 chain with an f32 output runs as
// one kernel, where the single ops take four (the inputs' casts are the input copy's).
TEST_CASE("fusion: casts on both ends of a bf16 chain join it") {
  Generator g(9);
  const Tensor x = randn({64, 40}, {}, &g).to(kGpu), y = randn({64, 40}, {}, &g).to(kGpu);
  auto fn = [](const std::vector<Tensor>& in) {
    const Tensor h = mul(cast(in[0], DType::bf16), cast(in[1], DType::bf16));
    return std::vector<Tensor>{cast(relu(add(h, 0.5)), DType::f32)};
  };
  CompiledFunction fused = compile(fn, {.fuse = true}), plain = compile(fn, {.fuse = false});
  for (int i = 0; i < 3; ++i) {
    CHECK(f64_bits(fused({x, y})[0]) == f64_bits(fn({x, y})[0]));
    CHECK(f64_bits(plain({x, y})[0]) == f64_bits(fn({x, y})[0]));
  }
  CHECK(fused.stats().kernels_per_graph.at(0) + 3 == plain.stats().kernels_per_graph.at(0));

  // A cast with no pointwise neighbour runs its own (vectorized) kernel: no module is built for
  // it. (Of a tensor the step holds: an input's is the input copy's.)
  CompiledFunction lone =
      compile([&x](const std::vector<Tensor>&) { return std::vector<Tensor>{cast(x, DType::bf16)}; });
  for (int i = 0; i < 3; ++i) CHECK(f64_bits(lone({y})[0]) == f64_bits(cast(x, DType::bf16)));
  const CompileStats stats = lone.stats();
  const std::map<std::string, std::size_t>& names = stats.kernel_names_per_graph.at(0);
  CHECK(names.count("kiln_unary") == 1);
  CHECK(names.count("kiln_fused") == 0);
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
    CHECK(f64_bits(out) == f64_bits(want));
    CHECK(f64_bits(kept) == f64_bits(add(x, bias)));
  }
  CHECK(cf.stats().kernels_per_graph.at(0) <= 2);  // the input copy and one fused kernel
}

TEST_CASE("fusion: the debug log names each group's ops and why it ended") {
  kiln_test::LogCapture logs(spdlog::level::debug, 4096);
  Generator g(5);
  const Tensor x = randn({64, 32}, {}, &g).to(kGpu), bias = randn({32}, {}, &g).to(kGpu);
  auto fn = [&](const std::vector<Tensor>& in) {
    // Its own statement: the product and the sum die with it, so only the ReLU's result is
    // written (a temporary still alive in the statement that flushes the group would be).
    const Tensor y = relu(add(mul(in[0], in[0]), in[1]));
    const Tensor s = sum(y);                // reads the group's result
    { const Tensor dropped = neg(in[0]); }  // nothing reads it
    return std::vector<Tensor>{s};
  };
  CompiledFunction cf = compile(fn, {.fuse = true});
  for (int i = 0; i < 3; ++i)
    CHECK(cf({x, bias})[0].item<float>() == doctest::Approx(sum(relu(add(mul(x, x), bias))).item<float>()));
  // The eager call and the capture each log their groups; replays dispatch nothing.
  const int grouped = logs.count(
                "[fuse] 3 ops (mul, add, relu) over (64,32), ended as other work reads or writes a "
                "value it holds: one kernel writing 1 of 3 results"),
            dropped = logs.count(
                "[fuse] 1 op (neg) over (64,32), ended as the compiled call ended: nothing outside "
                "reads the results, so none runs");
  CHECK(grouped == 2);
  CHECK(dropped == 2);
  if (grouped != 2 || dropped != 2)
    for (const std::string& line : logs.lines())
      if (line.find("[fuse]") != std::string::npos) MESSAGE(line);
}

TEST_CASE("fusion: a kernel plan lists a compiled step's groups in the order they run") {
  Generator g(6);
  const Tensor x = randn({64, 32}, {}, &g).to(kGpu), bias = randn({32}, {}, &g).to(kGpu);
  CompiledFunction cf = compile(
      [&](const std::vector<Tensor>& in) {
        const Tensor y = relu(add(mul(in[0], in[0]), in[1]));
        const Tensor s = sum(y);
        { const Tensor dropped = neg(in[0]); }
        return std::vector<Tensor>{s};
      },
      {.fuse = true});
  const KernelPlan plan = plan_kernels(
      [&] {
        cf({x, bias});
        cf({x, bias});  // the same signature: listed once
      },
      kGpu);
  REQUIRE(plan.steps.size() == 1);  // the capture's call; the pass's first, eager call is not listed
  const KernelPlan::Step& step = plan.steps[0];
  CHECK(step.signature == "grad|cuda:0|f32(64,32)|f32(32,)");
  REQUIRE(step.groups.size() == 3);
  CHECK(step.groups[0].ops == std::vector<std::string>{"mul", "add", "relu"});
  CHECK(step.groups[0].shape == "(64,32)");
  CHECK(step.groups[0].result == "one kernel writing 1 of 3 results");
  CHECK(step.groups[0].ended == "other work reads or writes a value it holds");
  CHECK(step.groups[1].ops == std::vector<std::string>{"sum"});
  CHECK(step.groups[1].result == "its own kernel: not a pointwise op");
  CHECK(step.groups[1].ended.empty());
  CHECK(step.groups[2].ops == std::vector<std::string>{"neg"});
  CHECK(step.groups[2].result == "nothing outside reads the results, so none runs");
  CHECK(step.groups[2].ended == "the compiled call ended");
  CHECK(cf.stats().captures == 0);  // the pass left the function as it was
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

// A fused group is found by its key: meeting it again (the capture call, another compiled
// function) builds no source, so a warm step makes no strings for its generated kernels.
TEST_CASE("fusion: a group met again builds no kernel source") {
  Generator g(5);
  const Tensor x = randn({48, 16}, {}, &g).to(kGpu), y = randn({48, 16}, {}, &g).to(kGpu);
  auto fn = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{tanh(mul(add(in[0], in[1]), in[1]))}; };
  CompiledFunction a = compile(fn, {.fuse = true});
  a({x, y});  // the eager call: the group's source is built here, at the latest
  const std::uint64_t built = rt::generated_builds();
  a({x, y});  // the capture call flushes the same group
  CompiledFunction b = compile(fn, {.fuse = true});
  const Tensor out = b({x, y})[0];  // another function's eager call, the same group
  CHECK(rt::generated_builds() == built);
  CHECK(f64_bits(out) == f64_bits(tanh(mul(add(x, y), y))));
  CHECK(a.stats().captures == 1);
  CHECK(b.stats().eager_calls == 1);
}
