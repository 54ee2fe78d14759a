// Autocast's low-precision copies of parameters: a forward reads the copy instead of casting
// the weight, the optimizer keeps it equal to a fresh cast of the updated weight, and a write
// to the weight from elsewhere (a restore, a load) is seen by the next eager or replayed step.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "core/registry.h"
#include "core/tensor/tensor_impl.h"
#include "gpu_match.h"
#include "kiln/kiln.h"

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

namespace {

// Elements of an f32 tensor that bf16 cannot hold (low 16 bits set): a gradient cast up from
// bf16 has none.
std::int64_t beyond_bf16(const Tensor& t) {
  std::int64_t n = 0;
  for (std::uint32_t b : kiln_test::f32_bits(t)) n += (b & 0xffffu) != 0;
  return n;
}

// |got - want| within 2e-6 of the sum of the terms' magnitudes, everywhere.
void check_f32_sums(const Tensor& got, const Tensor& want, const Tensor& magnitude, const char* name) {
  CAPTURE(name);
  REQUIRE(got.dtype() == DType::f32);
  const std::vector<double> g = got.to(Device::cpu()).to(DType::f64).to_vector<double>();
  const std::vector<double> w = want.to_vector<double>(), m = magnitude.to_vector<double>();
  REQUIRE(g.size() == w.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < g.size(); ++i) bad += !(std::abs(g[i] - w[i]) <= 2e-6 * m[i] + 1e-30);
  CHECK(bad == 0);
}

// conv2d_grad_weight with `f32_grad`, as a conv's backward asks for it.
Tensor call_conv_grad_weight_f32(const Tensor& x, const Tensor& gy, const Shape& ws, const Conv2dOptions& o) {
  const Attrs a{{"stride", o.stride},
                {"padding", o.padding},
                {"dilation", o.dilation},
                {"groups", o.groups},
                {"weight_shape", std::vector<std::int64_t>(ws.begin(), ws.end())},
                {"f32_grad", true}};
  const Tensor in[] = {x, gy};
  return dispatch(*find_op("conv2d_grad_weight"), in, a)[0];
}

}  // namespace

TEST_CASE("autocast weights: linear's weight and bias gradients reach .grad() as the f32 sums of the bf16 products") {
  // 8 outputs: the product and the bias sum as two kernels; 40: cuBLASLt's bias-gradient epilogue.
  for (std::int64_t out : {8, 40}) {
    CAPTURE(out);
    Generator gen(9);
    auto layer = std::make_shared<nn::Linear>(24, out, true, &gen);
    layer->to(kGpu);
    const Tensor x = randn({16, 24}, {}, &gen), r = randn({16, out}, {}, &gen);
    const Tensor xg = x.to(kGpu), rg = r.to(kGpu);
    // The product reads bf16 x; the gradient before it is bf16 r (the cast's gradient).
    const Tensor gp = cast(cast(r, DType::bf16), DType::f64), xb = cast(cast(x, DType::bf16), DType::f64);
    const Tensor dw = matmul(transpose(gp, 0, 1), xb), dw_mag = matmul(transpose(abs(gp), 0, 1), abs(xb));
    const Tensor db = sum(gp, {0}, false), db_mag = sum(abs(gp), {0}, false);
    auto step = [&](const std::vector<Tensor>& in) {
      for (Tensor p : layer->parameters()) p.zero_grad();
      Tensor y;
      {
        AutocastGuard amp(DType::bf16);
        y = (*layer)(in[0]);
      }
      Tensor loss = sum(mul(cast(y, DType::f32), in[1]));
      loss.backward();
      return std::vector<Tensor>{loss.detach()};
    };
    auto check = [&](const char* how) {
      CAPTURE(how);
      const Tensor gw = layer->parameters()[0].grad(), gb = layer->parameters()[1].grad();
      check_f32_sums(gw, dw, dw_mag, "weight");
      check_f32_sums(gb, db, db_mag, "bias");
      CHECK(beyond_bf16(gw) > gw.numel() / 2);
    };
    step({xg, rg});
    check("eager");
    CompiledFunction cf = compile(step);
    for (int call = 0; call < 3; ++call) {
      cf({xg, rg});
      check("compiled");
    }
    CHECK(cf.stats().replays == 1);
  }
}

TEST_CASE("autocast weights: a conv's weight gradient reaches .grad() as the f32 sums of the bf16 products") {
  // 16 -> 32 channels: the tile engine sums its splits into f32; 2 -> 3: the small weight-gradient
  // kernel does; 4 -> 4 in two groups: no kernel of that kind does, so the backward keeps the bf16
  // gradient and its cast (bf16 values).
  struct Case {
    std::int64_t c, o, groups;
    bool f32_sums;
  };
  for (const Case k : {Case{16, 32, 1, true}, Case{2, 3, 1, true}, Case{4, 4, 2, false}}) {
    CAPTURE(k.c);
    Generator gen(12);
    Tensor w = mul(randn({k.o, k.c / k.groups, 3, 3}, {}, &gen), 0.2).to(kGpu);
    w.requires_grad_(true);
    const Tensor x = randn({8, k.c, 16, 16}, {}, &gen), r = randn({8, k.o, 16, 16}, {}, &gen);
    const Tensor xg = x.to(kGpu), rg = r.to(kGpu);
    const Conv2dOptions pad{.padding = {1}, .groups = k.groups};
    const Tensor gy = cast(cast(r, DType::bf16), DType::f64), xb = cast(cast(x, DType::bf16), DType::f64);
    const Tensor dw = conv2d_grad_weight(xb, gy, w.shape(), pad);
    const Tensor dw_mag = conv2d_grad_weight(abs(xb), abs(gy), w.shape(), pad);
    auto step = [&](const std::vector<Tensor>& in) {
      w.zero_grad();
      Tensor y;
      {
        AutocastGuard amp(DType::bf16);
        y = conv2d(in[0], w, Tensor(), pad);
      }
      Tensor loss = sum(mul(cast(y, DType::f32), in[1]));
      loss.backward();
      return std::vector<Tensor>{loss.detach()};
    };
    auto check = [&](const char* how) {
      CAPTURE(how);
      const Tensor g = w.grad();
      if (k.f32_sums) {
        check_f32_sums(g, dw, dw_mag, "weight");
        CHECK(beyond_bf16(g) > g.numel() / 2);
      } else {
        kiln_test::check_match(cast(cast(dw, DType::bf16), DType::f32), g, 1e-2, "weight, cast from bf16");
        CHECK(beyond_bf16(g) == 0);
      }
    };
    step({xg, rg});
    check("eager");
    CompiledFunction cf = compile(step);
    for (int call = 0; call < 3; ++call) {
      cf({xg, rg});
      check("compiled");
    }
    // The op asked directly: the f32 sums at every size (without a kernel, it widens its operands).
    const Tensor direct = call_conv_grad_weight_f32(cast(xg, DType::bf16), cast(rg, DType::bf16), w.shape(), pad);
    check_f32_sums(direct, dw, dw_mag, "conv2d_grad_weight with f32_grad");
  }
}
