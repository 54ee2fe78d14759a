// Autocast's low-precision copies of parameters: a forward reads the copy instead of casting
// the weight, the optimizer keeps it equal to a fresh cast of the updated weight, and a write
// to the weight from elsewhere (a restore, a load) is seen by the next eager or replayed step.
#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "core/tensor/tensor_impl.h"
#include "kiln/kiln.h"
#include "gpu_match.h"

using namespace kiln;

namespace {

using kiln_test::kGpu;

std::vector<std::uint16_t> bits16(const Tensor& t) {
  const Tensor h = t.to(Device::cpu()).contiguous();
  std::vector<std::uint16_t> b(static_cast<std::size_t>(h.numel()));
  std::memcpy(b.data(), h.data_ptr(), b.size() * sizeof(std::uint16_t));
  return b;
}

std::uint32_t bits32(const Tensor& t) {
  const float v = t.item<float>();
  std::uint32_t b = 0;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// A Linear layer trained under autocast with Adam or SGD; `compiled` replays its step.
struct AutocastTrainer {
  Generator gen{7};
  std::shared_ptr<nn::Linear> layer = std::make_shared<nn::Linear>(24, 8, true, &gen);
  std::unique_ptr<optim::Optimizer> opt;
  DType dtype;

  AutocastTrainer(DType d, bool adam) : dtype(d) {
    layer->to(kGpu);
    if (adam) opt = std::make_unique<optim::Adam>(layer->parameters(), optim::AdamOptions{.lr = 0.01});
    else opt = std::make_unique<optim::SGD>(layer->parameters(), optim::SgdOptions{.lr = 0.05, .momentum = 0.9});
  }
  std::vector<Tensor> operator()(const std::vector<Tensor>& in) {
    opt->zero_grad();
    Tensor loss;
    {
      AutocastGuard amp(dtype);
      loss = mean(square(cast((*layer)(in[0]), DType::f32)));
    }
    loss.backward();
    opt->step();
    return {loss.detach()};
  }
  Tensor weight() const { return layer->parameters()[0]; }
};

}  // namespace

TEST_CASE("autocast weights: the optimizer keeps each copy equal to a fresh cast of the updated weight") {
  for (DType dt : {DType::bf16, DType::f16})
    for (bool adam : {true, false}) {
      CAPTURE(dtype_name(dt));
      CAPTURE(adam);
      AutocastTrainer t(dt, adam);
      Generator g(3);
      const Tensor x = randn({16, 24}, {}, &g).to(kGpu);
      for (int step = 0; step < 4; ++step) {
        t({x});
        for (const Tensor& p : t.layer->parameters()) {
          const std::shared_ptr<LowPrecisionCopy>& lp = p.impl()->low_precision;
          REQUIRE(lp);
          CHECK(lp->current_for(*p.impl()));
          CHECK(lp->copy.dtype() == dt);
          CHECK(bits16(lp->copy) == bits16(cast(p, dt)));
        }
      }
    }
}

TEST_CASE("autocast weights: compiled steps match eager ones bit for bit and see writes made between them") {
  for (bool adam : {true, false}) {
    CAPTURE(adam);
    AutocastTrainer eager(DType::bf16, adam), graph(DType::bf16, adam);
    CompiledFunction step = compile(std::ref(graph));
    Generator g(4);
    const Tensor x = randn({16, 24}, {}, &g).to(kGpu);
    for (int i = 0; i < 8; ++i) {
      CAPTURE(i);
      if (i == 5) {  // a write the optimizer does not make: both copies must follow it
        NoGradGuard no_grad;
        eager.weight().mul_(0.5);
        graph.weight().mul_(0.5);
      }
      const std::uint32_t want = bits32(eager({x})[0]);
      CHECK(bits32(step({x})[0]) == want);
      CHECK(bits16(graph.weight().impl()->low_precision->copy) == bits16(cast(graph.weight(), DType::bf16)));
    }
    CHECK(step.stats().captures == 1);
  }
}

TEST_CASE("autocast weights: a forward reads the copy, with no cast kernel for the weight") {
  AutocastTrainer t(DType::bf16, true);
  Generator g(5);
  const Tensor x = cast(randn({16, 24}, {}, &g), DType::bf16).to(kGpu);  // no cast for the input either
  auto forward = [&](const std::vector<Tensor>& in) {
    AutocastGuard amp(DType::bf16);
    return std::vector<Tensor>{(*t.layer)(in[0])};
  };
  t({cast(x, DType::f32)});  // the optimizer now keeps the copies
  CompiledFunction f = compile(forward);
  for (int i = 0; i < 3; ++i) CHECK(bits16(f({x})[0]) == bits16(forward({x})[0]));
  const CompileStats st = f.stats();
  CHECK(st.kernel_names_per_graph.at(0).count("kiln_unary") == 0);
  CHECK(st.kernel_names_per_graph.at(0).count("kiln_fused") == 0);
}
