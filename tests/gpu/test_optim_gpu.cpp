// Optimizers on the GPU against the CPU reference loop: SGD (plain, momentum with
// dampening, Nesterov with weight decay), Adam (with and without L2) and AdamW, in f32,
// f16, bf16 and f64, five steps, parameters and state compared. Also: a step queues behind
// running GPU work instead of waiting for it, a scheduled training loop with no item()
// inside ends where the CPU run ends, and CPU state restored onto GPU parameters.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpu_match.h"
#include "kiln/kiln.h"
#include "kiln/runtime/device.h"

using namespace kiln;

namespace {

using kiln_test::kGpu;

double optim_tolerance(DType t) {
  switch (t) {
    case DType::f16:
      return 4e-3;
    case DType::bf16:
      return 3e-2;
    case DType::f64:
      return 1e-12;
    default:
      return 2e-5;
  }
}

using kiln_test::check_match;

using Make = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

struct OptimCase {
  std::string name;
  Make make;
};

std::vector<OptimCase> optim_cases() {
  return {
      {"SGD(lr=0.1)", [](auto p) { return std::make_unique<optim::SGD>(std::move(p), optim::SgdOptions{.lr = 0.1}); }},
      {"SGD(momentum=0.9, dampening=0.2, weight_decay=0.01)",
       [](auto p) {
         return std::make_unique<optim::SGD>(
             std::move(p), optim::SgdOptions{.lr = 0.05, .momentum = 0.9, .dampening = 0.2, .weight_decay = 0.01});
       }},
      {"SGD(nesterov, momentum=0.9, weight_decay=0.05)",
       [](auto p) {
         return std::make_unique<optim::SGD>(
             std::move(p), optim::SgdOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true, .weight_decay = 0.05});
       }},
      {"Adam(lr=0.01)", [](auto p) { return std::make_unique<optim::Adam>(std::move(p), optim::AdamOptions{.lr = 0.01}); }},
      {"Adam(lr=0.01, weight_decay=0.1)",
       [](auto p) {
         return std::make_unique<optim::Adam>(std::move(p), optim::AdamOptions{.lr = 0.01, .weight_decay = 0.1});
       }},
      {"AdamW(lr=0.01, weight_decay=0.1)",
       [](auto p) {
         return std::make_unique<optim::AdamW>(std::move(p), optim::AdamOptions{.lr = 0.01, .weight_decay = 0.1});
       }},
  };
}

// Odd sizes, one element, and one past a full grid so the grid-stride loop wraps.
const std::vector<Shape> kShapes{{37, 19}, {1}, {3, 5, 7}, {1 << 21}};
constexpr int kSteps = 5;

struct OptimData {
  std::vector<Tensor> init;                // f32, per shape
  std::vector<std::vector<Tensor>> grads;  // [step][shape], f32
};

const OptimData& test_data() {
  static const OptimData d = [] {
    Generator gen(1234);
    OptimData r;
    for (const Shape& s : kShapes) r.init.push_back(randn(s, {}, &gen));
    for (int k = 0; k < kSteps; ++k) {
      r.grads.emplace_back();
      for (const Shape& s : kShapes) r.grads.back().push_back(randn(s, {}, &gen));
    }
    return r;
  }();
  return d;
}

// Leaves that require grad: the same values on the CPU and the GPU.
std::pair<std::vector<Tensor>, std::vector<Tensor>> leaves(const std::vector<Tensor>& init, DType t) {
  std::vector<Tensor> cpu, gpu;
  for (const Tensor& x : init) {
    cpu.push_back(x.to(t).clone());
    gpu.push_back(cpu.back().to(kGpu));
    cpu.back().requires_grad_();
    gpu.back().requires_grad_();
  }
  return {cpu, gpu};
}

void compare_all(const optim::Optimizer& cpu, const optim::Optimizer& gpu, DType t, const std::string& name) {
  const double tol = optim_tolerance(t);
  for (std::size_t j = 0; j < cpu.params().size(); ++j)
    check_match(cpu.params()[j], gpu.params()[j], tol, name + " param " + std::to_string(j));
  const nn::NamedTensors a = cpu.state(), b = gpu.state();
  REQUIRE(a.size() == b.size());
  for (std::size_t k = 0; k < a.size(); ++k) {
    REQUIRE(a[k].first == b[k].first);
    if (a[k].first == "step") CHECK(a[k].second.item<std::int64_t>() == b[k].second.item<std::int64_t>());
    else check_match(a[k].second, b[k].second, tol, name + " state " + a[k].first);
  }
}

}  // namespace

TEST_CASE("optim: every optimizer and dtype matches the CPU reference over five steps") {
  for (const OptimCase& c : optim_cases())
    for (DType t : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
      const std::string name = c.name + " dtype=" + std::string(dtype_name(t));
      auto both = leaves(test_data().init, t);  // named, not bound: clang 14 cannot capture bindings
      auto& cpu_params = both.first;
      auto& gpu_params = both.second;
      auto cpu = c.make(cpu_params), gpu = c.make(gpu_params);
      for (int k = 0; k < kSteps; ++k) {
        for (std::size_t j = 0; j < kShapes.size(); ++j) {
          const Tensor g = test_data().grads[k][j].to(t);
          cpu_params[j].set_grad(g);
          gpu_params[j].set_grad(g.to(kGpu));
        }
        cpu->step();
        gpu->step();
      }
      for (const auto& [slot, s] : gpu->state())
        if (slot != "step") CHECK(s.dtype() == (t == DType::f64 ? DType::f64 : DType::f32));
      compare_all(*cpu, *gpu, t, name);
    }
}

TEST_CASE("optim: a GPU step queues behind running work instead of waiting for it") {
  const std::vector<std::size_t> shapes{0, 3};  // (37,19) and (2^21)
  std::vector<Tensor> init;
  for (std::size_t j : shapes) init.push_back(test_data().init[j]);
  auto both = leaves(init, DType::f32);  // named, not bound: clang 14 cannot capture bindings
  auto& cpu_params = both.first;
  auto& gpu_params = both.second;
  optim::Adam cpu(cpu_params, {.lr = 0.01}), gpu(gpu_params, {.lr = 0.01});
  // Gradients reach the GPU before the long work: a host-to-device copy may wait for its staging buffer.
  std::vector<std::vector<Tensor>> gpu_grads(kSteps);
  for (int k = 0; k < kSteps; ++k)
    for (std::size_t j : shapes) gpu_grads[k].push_back(test_data().grads[k][j].to(kGpu));
  auto gpu_step = [&](int k) {
    for (std::size_t j = 0; j < shapes.size(); ++j) gpu_params[j].set_grad(gpu_grads[k][j]);
    gpu.step();
  };
  gpu_step(0);  // loads the kernels and creates the moments
  rt::default_stream(0).synchronize();

  // About 0.1 s of f32 matmuls; a host synchronisation inside step() would wait for them.
  Tensor a = randn({4096, 4096}, {.device = kGpu}) * 0.01, c;
  for (int i = 0; i < 40; ++i) c = matmul(a, a);
  rt::Event queued = rt::Event::create(0);
  queued.record(rt::default_stream(0));
  for (int k = 1; k < kSteps; ++k) gpu_step(k);
  CHECK_MESSAGE(!queued.done(), "step() returned only after the queued GPU work finished");

  for (int k = 0; k < kSteps; ++k) {
    for (std::size_t j = 0; j < shapes.size(); ++j) cpu_params[j].set_grad(test_data().grads[k][shapes[j]]);
    cpu.step();
  }
  compare_all(cpu, gpu, DType::f32, "Adam after queued work");
}

TEST_CASE("optim: a scheduled GPU training loop with no item() inside ends where the CPU run ends") {
  // Least squares y = X w*, X [64, 8]; Adam under OneCycleLR for 300 steps.
  Generator gen(7);
  const Tensor x = randn({64, 8}, {}, &gen), w_star = randn({8, 1}, {}, &gen);
  const Tensor y = matmul(x, w_star);
  auto fit = [&](Device d) {
    Tensor w = zeros({8, 1}, {.device = d});
    w.requires_grad_();
    const Tensor xd = x.to(d), yd = y.to(d);
    optim::Adam opt({w}, {.lr = 0.05});
    optim::OneCycleLR sched(opt, 0.1, 300);
    for (int k = 0; k < 300; ++k) {
      Tensor loss = mse_loss(matmul(xd, w), yd);
      loss.backward();
      opt.step();
      opt.zero_grad();
      sched.step();
    }
    return w;
  };
  const Tensor w_cpu = fit(Device::cpu()), w_gpu = fit(kGpu);
  check_match(w_cpu, w_gpu, 1e-4, "w after 300 steps");
  check_match(w_star, w_gpu, 1e-3, "w against the solution");
}

TEST_CASE("optim: state saved on the CPU continues on GPU parameters") {
  for (DType t : {DType::f32, DType::bf16}) {
    auto both = leaves(test_data().init, t);  // named, not bound: clang 14 cannot capture bindings
    auto& cpu_params = both.first;
    auto& gpu_params = both.second;
    optim::SGD cpu(cpu_params, {.lr = 0.05, .momentum = 0.9}), gpu(gpu_params, {.lr = 0.05, .momentum = 0.9});
    auto set_grads = [&](int k, bool on_cpu) {
      for (std::size_t j = 0; j < kShapes.size(); ++j) {
        const Tensor g = test_data().grads[k][j].to(t);
        if (on_cpu) cpu_params[j].set_grad(g);
        else gpu_params[j].set_grad(g.to(kGpu));
      }
    };
    set_grads(0, true);
    cpu.step();
    {
      NoGradGuard no_grad;
      for (std::size_t j = 0; j < kShapes.size(); ++j) gpu_params[j].copy_(cpu_params[j]);
    }
    gpu.load_state(cpu.state());
    for (const auto& [slot, s] : gpu.state()) CHECK(s.device() == (slot == "step" ? Device::cpu() : kGpu));
    for (int k = 1; k < kSteps; ++k) {
      set_grads(k, true);
      set_grads(k, false);
      cpu.step();
      gpu.step();
    }
    compare_all(cpu, gpu, t, "SGD restored on the GPU dtype=" + std::string(dtype_name(t)));
  }
}

TEST_CASE("optim: one launch per 32 parameters of a dtype; mixed dtypes, empty and multi-chunk tensors match the CPU") {
  // 70 parameters: f32 and f16 interleaved, sizes 0 to 9000 (a block covers 4096 elements).
  Generator gen(21);
  std::vector<Tensor> init;
  for (int i = 0; i < 70; ++i) {
    const std::int64_t n = i % 7 == 0 ? 0 : (i * 1297) % 9001;
    init.push_back(randn({n}, {.dtype = i % 2 ? DType::f16 : DType::f32}, &gen));
  }
  const std::vector<Make> makes{
      [](std::vector<Tensor> p) { return std::make_unique<optim::Adam>(std::move(p), optim::AdamOptions{.lr = 0.01}); },
      [](std::vector<Tensor> p) {
        return std::make_unique<optim::SGD>(std::move(p), optim::SgdOptions{.lr = 0.05, .momentum = 0.9});
      }};
  for (std::size_t k = 0; k < makes.size(); ++k) {
    CAPTURE(k);
    std::vector<Tensor> cpu_params, gpu_params;
    for (const Tensor& t : init) {
      cpu_params.push_back(t.clone().requires_grad_());
      gpu_params.push_back(t.to(kGpu).requires_grad_());
    }
    auto cpu = makes[k](cpu_params), gpu = makes[k](gpu_params);
    for (int step = 0; step < 3; ++step) {
      for (std::size_t j = 0; j < init.size(); ++j) {
        if (j % 11 == 3) continue;  // no gradient: skipped
        const Tensor g = randn(init[j].shape(), {.dtype = init[j].dtype()}, &gen);
        cpu_params[j].set_grad(g);
        gpu_params[j].set_grad(g.to(kGpu));
      }
      cpu->step();
      gpu->step();
    }
    for (std::size_t j = 0; j < init.size(); ++j)
      check_match(cpu_params[j], gpu_params[j], optim_tolerance(init[j].dtype()), "param " + std::to_string(j));
  }
}
