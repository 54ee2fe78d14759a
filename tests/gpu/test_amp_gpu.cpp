// Mixed precision on the GPU: GradScaler skips a step after inf gradients both eagerly and
// inside a compiled (CUDA graph) step, where only the device knows; bf16 and f16 autocast
// training of the mnist MLP tracks f32 loosely; the autocast dtype is part of a compiled
// function's signature.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "../../examples/mnist/models.h"
#include "kiln/kiln.h"
#include "gpu_match.h"

using namespace kiln;

namespace {

using kiln_test::kGpu;
constexpr float kFloatInf = std::numeric_limits<float>::infinity();

Tensor gpu_param(std::vector<float> v) {
  Tensor p = from_vector(v).to(kGpu);
  p.requires_grad_();
  return p;
}

std::vector<float> host(const Tensor& t) { return t.to(Device::cpu()).to_vector<float>(); }

// One scaled step of loss = sum(p * in[0]): p's gradient is in[0].
struct ScaledStep {
  Tensor p = gpu_param({1, 2, 3, 4});
  optim::SGD opt{{p}, {.lr = 0.5, .momentum = 0.9}};
  optim::GradScaler scaler{{.init_scale = 1024, .growth_interval = 2}};

  std::vector<Tensor> operator()(const std::vector<Tensor>& in) {
    opt.zero_grad();
    Tensor loss = sum(mul(p, in[0]));
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    return {loss.detach()};
  }
};

Tensor grads_of(std::vector<float> g) { return from_vector(g).to(kGpu); }

}  // namespace

TEST_CASE("GradScaler on the GPU, eager: inf gradients skip the step and halve the scale") {
  ScaledStep s;
  s({grads_of({1, 1, 1, 1})});
  const std::vector<float> after_one = host(s.p);
  CHECK(after_one == std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f});
  CHECK(s.scaler.growth_tracker() == 1);
  s({grads_of({1, kFloatInf, 1, 1})});
  CHECK(host(s.p) == after_one);
  CHECK(s.opt.steps() == 1);
  CHECK(s.scaler.scale_value() == 512);
  CHECK(s.scaler.growth_tracker() == 0);
  s({grads_of({1, 1, 1, 1})});
  s({grads_of({1, 1, 1, 1})});
  CHECK(s.scaler.scale_value() == 1024);  // two clean steps grow it back
  CHECK(s.opt.steps() == 3);
}

TEST_CASE("GradScaler in a compiled step: a replay after inf gradients changes no parameter or momentum") {
  ScaledStep eager, graph;
  CompiledFunction step = compile([&](const std::vector<Tensor>& in) { return graph(in); });
  const std::vector<std::vector<float>> grads{{1, 1, 1, 1}, {1, 2, 1, 1}, {1, 1, 1, 1}, {1, kFloatInf, 1, 1},
                                              {2, 1, 1, 1}, {1, 1, 3, 1}, {1, 1, 1, 1}, {std::nanf(""), 1, 1, 1}};
  for (std::size_t i = 0; i < grads.size(); ++i) {
    CAPTURE(i);
    const Tensor g = grads_of(grads[i]);
    const std::vector<float> before = host(graph.p);
    const bool bad = !std::isfinite(grads[i][0]) || !std::isfinite(grads[i][1]);
    // The momentum buffer ("0.momentum_buffer", after "step") exists from the first step on.
    const std::vector<float> momentum_before = i > 0 ? host(graph.opt.state().at(1).second) : std::vector<float>{};
    step({g});
    eager({g});
    if (bad) {
      CHECK(host(graph.p) == before);
      CHECK(host(graph.opt.state().at(1).second) == momentum_before);
    } else {
      CHECK(host(graph.p) != before);
    }
    // Parameters, momentum and the scale schedule agree with the eager scaler.
    CHECK(host(graph.p) == host(eager.p));
    CHECK(graph.scaler.scale_value() == eager.scaler.scale_value());
    CHECK(graph.scaler.growth_tracker() == eager.scaler.growth_tracker());
  }
  const CompileStats st = step.stats();
  CHECK(st.captures == 1);
  CHECK(st.replays == grads.size() - 2);
  REQUIRE(st.kernel_names_per_graph.size() == 1);
  for (const char* k : {"kiln_unscale_grads", "kiln_update_scale", "kiln_sgd_step"}) {
    CAPTURE(k);
    CHECK(st.kernel_names_per_graph[0].count(k) == 1);
  }
  // The host step count advances at every replay, skipped or not (optimizer.h says so).
  CHECK(graph.opt.steps() == static_cast<std::int64_t>(grads.size()));
  CHECK(eager.opt.steps() == static_cast<std::int64_t>(grads.size()) - 2);
}

namespace {

struct Run {
  std::vector<float> losses;
};

// The mnist MLP, Adam, 40 steps over 4 fixed batches; `amp` the autocast dtype (nullopt: f32).
Run train_mlp(std::optional<DType> amp, bool compiled) {
  Generator gen(21);
  auto net = mnist::make_model("mlp", gen);
  net->to(kGpu);
  optim::Adam opt(net->parameters(), {.lr = 1e-3});
  optim::GradScaler scaler({.enabled = amp == DType::f16});
  Generator data(22);
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (int i = 0; i < 4; ++i)
    batches.emplace_back(randn({64, 784}, {}, &data).to(kGpu), randint(0, 10, {64}, {}, &data).to(kGpu));
  auto fn = [&](const std::vector<Tensor>& in) {
    opt.zero_grad();
    Tensor loss;
    {
      AutocastGuard guard(amp);
      loss = cross_entropy((*net)(in[0]), in[1]);
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    return std::vector<Tensor>{loss.detach()};
  };
  CompiledFunction cf = compile(fn);
  Run r;
  for (int i = 0; i < 40; ++i) {
    const auto& [x, y] = batches[static_cast<std::size_t>(i % 4)];
    const Tensor loss = compiled ? cf({x, y})[0] : fn({x, y})[0];
    CHECK(loss.dtype() == DType::f32);
    r.losses.push_back(loss.item<float>());
  }
  for (const Tensor& p : net->parameters()) {
    CHECK(p.dtype() == DType::f32);
    CHECK(p.grad().dtype() == DType::f32);
  }
  return r;
}

}  // namespace

TEST_CASE("autocast training on the GPU: bf16 and f16 (with GradScaler) track f32, eager and compiled") {
  const Run f32 = train_mlp(std::nullopt, false);
  CHECK(f32.losses.back() < 0.5f * f32.losses.front());  // it memorises the four batches
  for (DType t : {DType::bf16, DType::f16})
    for (bool compiled : {false, true}) {
      CAPTURE(dtype_name(t));
      CAPTURE(compiled);
      const Run r = train_mlp(t, compiled);
      // Loosely: rounding the inputs to 8 (bf16) or 11 (f16) bits moves each step's loss a little.
      for (std::size_t i = 0; i < r.losses.size(); ++i) {
        CAPTURE(i);
        CHECK(std::isfinite(r.losses[i]));
        CHECK(std::abs(r.losses[i] - f32.losses[i]) <= 0.05f + 0.05f * f32.losses[i]);
      }
      CHECK(r.losses.back() < 0.5f * r.losses.front());
    }
}

TEST_CASE("compile: the autocast dtype is part of the signature") {
  Generator g(3);
  const Tensor w = randn({8, 16}, {}, &g).to(kGpu);
  CompiledFunction cf = compile([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{linear(in[0], w)}; });
  const Tensor x = randn({4, 16}, {}, &g).to(kGpu);
  for (int i = 0; i < 3; ++i) {
    CHECK(cf({x})[0].dtype() == DType::f32);
    AutocastGuard amp(DType::bf16);
    CHECK(cf({x})[0].dtype() == DType::bf16);
  }
  const CompileStats st = cf.stats();
  CHECK(st.eager_calls == 2);
  CHECK(st.captures == 2);
  CHECK(st.replays == 2);
}
