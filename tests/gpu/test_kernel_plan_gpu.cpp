// Kernel plans: a shape-only pass runs nothing on the GPU and keeps no compiled-function state,
// and the kernels it lists (per-shape convs and fused kernels included) are every kernel the
// real step then asks for: after prefetch_kernels, the step waits for none.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>

#include "gpu_match.h"
#include "kiln/kiln.h"
#include "kiln/runtime/graph.h"
#include "kiln/runtime/kernel_plan.h"

using namespace kiln;

namespace {

using kiln_test::kGpu;

// A small cnn of shapes no other test uses, so its per-shape kernels are new to the process.
struct PlanNet {
  Generator gen{11};
  std::shared_ptr<nn::Sequential> model = std::make_shared<nn::Sequential>();
  std::unique_ptr<optim::Adam> opt;

  PlanNet() {
    model->push_back(nn::Conv2d(3, 13, {3}, {.padding = {1}}, false, &gen));
    model->push_back(nn::BatchNorm2d(13));
    model->push_back(nn::ReLU());
    model->push_back(nn::MaxPool2d({2}));
    model->push_back(nn::Flatten());
    model->push_back(nn::Linear(13 * 5 * 5, 7, true, &gen));
    model->to(kGpu);
    opt = std::make_unique<optim::Adam>(model->parameters(), optim::AdamOptions{.lr = 1e-2});
  }

  CompiledFunction step(std::optional<DType> autocast) {
    return compile([this, autocast](const std::vector<Tensor>& in) {
      opt->zero_grad();
      Tensor loss;
      {
        AutocastGuard amp(autocast);
        Tensor x = mul(add(in[0], 0.5), 2.0);  // a pointwise chain: a fused kernel
        loss = cross_entropy((*model)(x), in[1]);
      }
      loss.backward();
      opt->step();
      return std::vector<Tensor>{loss.detach()};
    });
  }
};

std::vector<Tensor> batch(std::int64_t n) {
  Generator g(3);
  return {randn({n, 3, 10, 10}, {.device = kGpu}, &g), randint(0, 7, {n}, {.device = kGpu}, &g)};
}

}  // namespace

TEST_CASE("a shape-only pass launches nothing, reads zeros and leaves a compiled function as it was") {
  Tensor x = full({64}, 3.0, {.device = kGpu});
  Tensor y;
  double read = -1;
  const KernelPlan plan = plan_kernels(
      [&] {
        x.add_(1.0);
        y = exp(x);
        read = sum(y).item<double>();
        CHECK(rt::shape_only());
      },
      kGpu);
  CHECK_FALSE(rt::shape_only());
  CHECK(read == 0.0);  // reads from the GPU in a pass give zeros
  CHECK(sum(x).item<double>() == 64 * 3.0);  // x.add_ never ran
  bool has_exp = false;
  for (const KernelPlan::Kernel& k : plan.kernels) {
    has_exp = has_exp || k.op == "exp";
    CHECK_FALSE(k.source.empty());
  }
  CHECK(has_exp);
  CHECK(plan.kernels.size() >= 3);  // add_, exp and the sum

  PlanNet net;
  CompiledFunction step = net.step(std::nullopt);
  const Tensor w = net.model->parameters()[0].detach().clone();
  const std::vector<Tensor> in = batch(6);
  plan_kernels([&] { step(in); }, kGpu);
  CHECK(step.stats().eager_calls == 0);
  CHECK(step.stats().captures == 0);
  CHECK(max(abs(sub(net.model->parameters()[0].detach(), w))).item<double>() == 0.0);  // the optimizer's update never ran
  step(in);
  CHECK(step.stats().eager_calls == 1);
  // The optimizer's slots and the gradients the pass made take zeroed memory at their first
  // real use: the step trained from them.
  const Tensor moved = max(abs(sub(net.model->parameters()[0].detach(), w)));
  CHECK(std::isfinite(moved.item<double>()));
  CHECK(moved.item<double>() > 0);
}

TEST_CASE("a tensor a shape-only pass made reads zeros after it, and takes no memory in a graph capture") {
  Tensor kept, captured;
  plan_kernels(
      [&] {
        kept = full({1000}, 5.0, {.device = kGpu});
        captured = full({10}, 5.0, {.device = kGpu});
        CHECK(rt::default_stream(kGpu.index()).unbacked());  // the pass opens no stream of its own
      },
      kGpu);
  CHECK_FALSE(rt::default_stream(kGpu.index()).unbacked());
  CHECK(sum(kept).item<double>() == 0.0);  // what the pass read
  kept.add_(2.0);
  CHECK(sum(kept).item<double>() == 2000.0);
  const rt::Stream& s = rt::default_stream(kGpu.index());
  rt::begin_capture(s);
  CHECK_THROWS_WITH_AS(captured.add_(1.0), doctest::Contains("graph capture"), ValueError);
  rt::abort_capture(s);
  CHECK(sum(captured).item<double>() == 0.0);  // after the capture, memory as usual
}

TEST_CASE("a shape-only pass leaves no constant behind: a later backward still starts from 1") {
  for (const DType dtype : {DType::f64, DType::f16}) {
    CAPTURE(dtype_name(dtype));
    plan_kernels(
        [&] {
          Tensor x = ones({4}, {.dtype = dtype, .device = kGpu}).requires_grad_();
          sum(mul(x, 3.0)).backward();
        },
        kGpu);
    Tensor x = ones({4}, {.dtype = dtype, .device = kGpu}).requires_grad_();
    sum(mul(x, 3.0)).backward();
    CHECK(sum(x.grad()).item<double>() == 12.0);
  }
}

TEST_CASE("after prefetch_kernels, a compiled step waits for no kernel: the plan lists them all") {
  for (const std::optional<DType> autocast : {std::optional<DType>{}, std::optional<DType>{DType::bf16}}) {
    CAPTURE(autocast.has_value());
    const std::vector<Tensor> in = batch(autocast ? 9 : 5);  // shapes of their own: new per-shape kernels
    KernelPlan plan;
    {
      PlanNet throwaway;
      CompiledFunction step = throwaway.step(autocast);
      plan = plan_kernels([&] { step(in); }, kGpu);
    }
    bool generated = false;
    for (const KernelPlan::Kernel& k : plan.kernels) generated = generated || !k.label.empty();
    CHECK(generated);  // the fused chain and the per-shape convs

    prefetch_kernels(plan, kGpu);
    rt::wait_for_prefetch();
    PlanNet net;
    CompiledFunction step = net.step(autocast);
    const double waited = kernel_stats().wait_ms;
    const std::uint64_t compiled = kernel_stats().compiled;
    step(in);  // eager
    step(in);  // capture
    step(in);  // replay
    CHECK(kernel_stats().wait_ms == waited);
    CHECK(kernel_stats().compiled == compiled);
    CHECK(step.stats().captures == 1);
    // The steps trained: the weights moved (a pass leaves nothing that would stop them).
    PlanNet fresh;
    CHECK(max(abs(sub(net.model->parameters()[0].detach(), fresh.model->parameters()[0].detach()))).item<double>() > 0);
  }
}

TEST_CASE("plan_kernels and prefetch_kernels refuse the CPU and an empty function") {
  CHECK_THROWS_AS(plan_kernels([] {}, Device::cpu()), DeviceError);
  CHECK_THROWS_AS(plan_kernels(nullptr, kGpu), ValueError);
  CHECK_THROWS_AS(prefetch_kernels(KernelPlan{}, Device::cpu()), DeviceError);
  KernelPlan unknown;
  unknown.kernels.push_back({"no_such_kernel", "f32", 0, "", ""});
  CHECK_THROWS_WITH_AS(prefetch_kernels(unknown, kGpu), doctest::Contains("no_such_kernel"), ValueError);
  CHECK_THROWS_WITH_AS(
      {
        plan_kernels([] { plan_kernels([] {}, kGpu); }, kGpu);
      },
      doctest::Contains("do not nest"), ValueError);
}
