// An output layer's product on the GEMM family's row kind and the softmax cross-entropy of its
// rows in one kernel (kernels::launch_rowdot_cross_entropy): the same bits as the row kernel and
// then the cross-entropy kernel, in every logits dtype, loss dtype, reduction, smoothing,
// ignore_index and rows a block; the product against the CPU's; and in a compiled training step, where the
// linear layer's product is held for the loss, one kernel with eager's losses and gradients, the
// loss's gradient 1 or not; over a ReLU layer, that kernel also writes the layer's masked input
// gradient (no kernel of its own), as the row input-gradient kernel does in eager, and in bf16 the
// output layer's weight-gradient kernel also sums a fused ReLU layer's bias gradient from it, in
// eager and compiled steps alike; a warm run's plan holds the fused kernel its step runs.
#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda/gemm_lt.h"
#include "backend/cuda/generated/gemm/gemm_plan.h"
#include "backend/cuda/softmax_kernels.h"
#include "gpu_match.h"
#include "kiln/kiln.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/kernel_plan.h"
#include "kiln/runtime/tuning.h"
#include "ops/linear_grads.h"

using namespace kiln;

namespace {

using kiln_test::kGpu;

std::uint64_t addr(const Tensor& t) { return reinterpret_cast<std::uint64_t>(t.data_ptr()); }

// The bits of any tensor, through f64 (exact for every float dtype).
std::vector<std::uint64_t> bits(const Tensor& t) { return kiln_test::f64_bits(t); }

// Labels in [0, c), every fifth one -100 when `ignored`.
Tensor labels_of(std::int64_t n, std::int64_t c, bool ignored, std::uint64_t seed) {
  Generator g(seed);
  std::vector<std::int64_t> v = randint(0, c, {n}, {}, &g).to_vector<std::int64_t>();
  if (ignored)
    for (std::size_t i = 0; i < v.size(); i += 5) v[i] = -100;
  return from_vector(v, {n}).to(kGpu);
}

// What one cross-entropy writes: the loss, rows scratch, stats and the unit gradient.
struct CeOut {
  Tensor loss, rows, stats, dx;
  CeOut(std::int64_t n, std::int64_t c, DType t, DType loss_t, int reduction, bool unit)
      : loss(zeros({reduction == 0 ? n : 1}, {.dtype = loss_t, .device = kGpu})),
        rows(zeros({n}, {.device = kGpu})),
        stats(zeros({n + 1}, {.device = kGpu})),
        dx(unit ? zeros({n, c}, {.dtype = t, .device = kGpu}) : Tensor()) {}
  kernels::RowCrossEntropy args(DType loss_t, const Tensor& labels, int reduction, double eps, bool ignored) const {
    return {loss_t,    addr(labels), addr(loss), addr(rows), addr(stats), dx.defined() ? addr(dx) : 0,
            reduction, eps,          -100,       ignored};
  }
};

// The tuner's choice for a (rows x k) @ (k x c) output layer's product with bias in t, stored as
// the row kind: a compiled step holds the product for the loss. Gives the launch's name.
std::string store_row_choice(DType t, std::int64_t rows, std::int64_t c, std::int64_t k) {
  const kernels::LtMatmul g{.dtype = t,
                            .m = c,
                            .n = rows,
                            .k = k,
                            .trans_a = true,
                            .lda = k,
                            .ldb = k,
                            .ldd = c,
                            .epilogue = kernels::LtEpilogue::bias,
                            .a = 1 << 20,
                            .b = 2 << 20,
                            .d = 3 << 20,
                            .bias = 4 << 20};
  const kernels::GemmMath math = t == DType::f32    ? kernels::GemmMath::f32
                                 : t == DType::bf16 ? kernels::GemmMath::bf16
                                                    : kernels::GemmMath::f16;
  const auto l = kernels::plan(kernels::GemmKernel::rowdot, {rows, c, k, k, k, c, math, kernels::GemmEpilogue::bias},
                               kernels::gemm_target(0));
  REQUIRE(l);
  rt::store_choice(kernels::lt_tune_key(g, 0), {l->text(), "stored by the test"});
  return l->text();
}

using Step = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// `step` eager once, then compiled: four replays give eager's bits. The graph's kernel counts.
std::map<std::string, std::size_t> compiled_as_eager(const Step& step, const std::vector<Tensor>& in,
                                                     std::vector<Tensor>& eager) {
  eager = step(in);
  CompiledFunction cf = compile(step);
  for (int k = 0; k < 4; ++k) {
    const std::vector<Tensor> got = cf(in);
    CAPTURE(k);
    REQUIRE(got.size() == eager.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(bits(got[i]) == bits(eager[i]));
  }
  const CompileStats st = cf.stats();
  REQUIRE(st.kernel_names_per_graph.size() == 1);
  return st.kernel_names_per_graph[0];
}

std::size_t count_of(const std::map<std::string, std::size_t>& names, const char* name) {
  return names.count(name) ? names.at(name) : std::size_t{0};
}

}  // namespace

TEST_CASE("the row kind's product and its rows' cross-entropy in one kernel give the two kernels' bits") {
  const kernels::GemmTarget tgt = kernels::gemm_target(0);
  const rt::Stream& s = rt::default_stream(0);
  struct Case {
    kernels::GemmMath math;
    DType loss;
    std::int64_t n, c, k;
  };
  const Case cases[] = {{kernels::GemmMath::f32, DType::f32, 128, 10, 512},
                        {kernels::GemmMath::tf32, DType::f32, 300, 7, 509},
                        {kernels::GemmMath::bf16, DType::f32, 128, 10, 128},
                        {kernels::GemmMath::bf16, DType::bf16, 1000, 32, 784},
                        {kernels::GemmMath::f16, DType::f32, 96, 10, 200}};
  // The row kernel's rows a block, for each case: the heuristic's, then 1, 2, 8 and 16 (the fused
  // kernel runs softmax.cu's blocks whatever they are).
  const int warps[] = {0, 1, 2, 8, 16};
  int runs = 0, index = 0;
  for (const Case& cs : cases)
    for (const int tile_rows = warps[index++]; int reduction : {0, 1, 2})
      for (double eps : {0.0, 0.1})
        for (bool ignored : {false, true}) {
          const DType t = kernels::input_dtype(cs.math);
          const bool unit = reduction == 1 || (reduction == 2 && !ignored);
          CAPTURE(kernels::math_name(cs.math));
          CAPTURE(dtype_name(cs.loss));
          CAPTURE(reduction);
          CAPTURE(eps);
          CAPTURE(ignored);
          Generator g(static_cast<std::uint64_t>(40 + runs));
          const Tensor x = randn({cs.n, cs.k}, {}, &g).to(t).to(kGpu), w = randn({cs.c, cs.k}, {}, &g).to(t).to(kGpu),
                       b = randn({cs.c}, {}, &g).to(t).to(kGpu);
          const Tensor labels = labels_of(cs.n, cs.c, ignored, static_cast<std::uint64_t>(runs));
          kernels::GemmGeometry geo{cs.n, cs.c, cs.k, cs.k, cs.k, cs.c, cs.math, kernels::GemmEpilogue::bias};
          const std::optional<kernels::GemmLaunch> l =
              kernels::plan(kernels::GemmKernel::rowdot, geo, tgt, {tile_rows, tile_rows ? static_cast<int>(cs.c) : 0});
          REQUIRE(l);
          CAPTURE(l->text());
          // Apart: the row kernel, then the cross-entropy kernel over its logits.
          const Tensor apart = zeros({cs.n, cs.c}, {.dtype = t, .device = kGpu});
          CeOut two(cs.n, cs.c, t, cs.loss, reduction, unit);
          kernels::launch(*l, {addr(x), addr(w), addr(apart), addr(b), &s});
          const kernels::RowCrossEntropy a2 = two.args(cs.loss, labels, reduction, eps, ignored);
          kernels::launch_cross_entropy(t, cs.loss, addr(apart), a2.labels, a2.out, a2.rows, a2.stats, a2.unit_dx, cs.n,
                                        cs.c, reduction, eps, -100, ignored, s);
          // Together.
          const Tensor fused = zeros({cs.n, cs.c}, {.dtype = t, .device = kGpu});
          CeOut one(cs.n, cs.c, t, cs.loss, reduction, unit);
          kernels::launch_rowdot_cross_entropy(*l, {addr(x), addr(w), addr(fused), addr(b), &s},
                                               one.args(cs.loss, labels, reduction, eps, ignored));
          CHECK(bits(fused) == bits(apart));
          CHECK(bits(one.loss) == bits(two.loss));
          CHECK(bits(one.stats) == bits(two.stats));
          if (unit) {
            CHECK(bits(one.dx) == bits(two.dx));
            // Again with x's input gradient masked where x > 0 (as a ReLU's output): the bits of
            // the row input-gradient kernel over the unit gradient.
            const Tensor masked = zeros({cs.n, cs.k}, {.dtype = t, .device = kGpu}), again = zeros_like(fused);
            CeOut three(cs.n, cs.c, t, cs.loss, reduction, unit);
            kernels::RowCrossEntropy a3 = three.args(cs.loss, labels, reduction, eps, ignored);
            a3.masked_dx = addr(masked);
            kernels::launch_rowdot_cross_entropy(*l, {addr(x), addr(w), addr(again), addr(b), &s}, a3);
            const Tensor apart_dx = zeros({cs.n, cs.k}, {.dtype = t, .device = kGpu});
            const auto ig = kernels::plan_rowdot_input_grad(t, cs.n, cs.c, cs.k, tgt);
            REQUIRE(ig);
            kernels::launch_rowdot_input_grad(*ig, addr(two.dx), addr(w), addr(x), addr(apart_dx), s);
            CHECK(bits(again) == bits(fused));
            CHECK(bits(three.dx) == bits(one.dx));
            CHECK(bits(masked) == bits(apart_dx));
            if (runs % 4 == 0) {
              const Tensor want =
                  relu_backward(matmul(two.dx.to(Device::cpu()).to(DType::f64), w.to(Device::cpu()).to(DType::f64)),
                                x.to(Device::cpu()).to(DType::f64));
              kiln_test::check_match(want.to(t), masked, t == DType::f32 ? 1e-5 : 2e-2, "masked input gradient");
            }
          }
          ++runs;
        }
  // The product itself against the CPU's (the cross-entropy kernel's own tests cover the rest).
  Generator g(7);
  const Tensor x = randn({128, 512}, {}, &g), w = randn({10, 512}, {}, &g), b = randn({10}, {}, &g);
  const Tensor y = zeros({128, 10}, {.device = kGpu}), labels = labels_of(128, 10, false, 3);
  const Tensor xg = x.to(kGpu), wg = w.to(kGpu), bg = b.to(kGpu);
  const auto l = kernels::plan(kernels::GemmKernel::rowdot,
                               {128, 10, 512, 512, 512, 10, kernels::GemmMath::f32, kernels::GemmEpilogue::bias}, tgt);
  REQUIRE(l);
  CeOut out(128, 10, DType::f32, DType::f32, 2, true);
  kernels::launch_rowdot_cross_entropy(*l, {addr(xg), addr(wg), addr(y), addr(bg), &s},
                                       out.args(DType::f32, labels, 2, 0.0, false));
  kiln_test::check_match(linear(x, w, b), y, 1e-5, "the fused kernel's logits");
  kiln_test::check_match(cross_entropy(linear(x, w, b), labels.to(Device::cpu())).reshape({1}), out.loss, 1e-5,
                         "its loss");
  MESSAGE(runs << " cases of the fused kernel");
}

// The tuner's choice for the layer's product is stored as the row kind, so the compiled step
// holds it for the loss; eager runs the row kernel and then the cross-entropy kernel.
TEST_CASE("in a compiled step the output layer's row product and its cross-entropy are one kernel, eager's bits") {
  struct Case {
    DType t;  // the layer's dtype: f32, or bf16 or f16 under autocast (an f32 loss)
    std::int64_t n, k;
    // The loss's gradient not 1 (as a GradScaler's): the backward reads the logits and statistics
    // the fused kernel wrote, where the unit gradient takes the one it wrote.
    double scale = 1;
  };
  for (const Case cs : {Case{DType::f32, 96, 200}, Case{DType::bf16, 80, 136}, Case{DType::f16, 72, 96},
                        Case{DType::f32, 96, 200, 1024}}) {
    CAPTURE(dtype_name(cs.t));
    CAPTURE(cs.scale);
    const std::int64_t c = 10;
    store_row_choice(cs.t, cs.n, c, cs.k);
    Generator gen(21);
    nn::Linear layer(cs.k, c, true, &gen);
    layer.to(kGpu);
    auto step = [&](const std::vector<Tensor>& in) {
      layer.zero_grad();
      Tensor loss;
      {
        std::optional<AutocastGuard> amp;
        if (cs.t != DType::f32) amp.emplace(cs.t);
        loss = cross_entropy(layer.forward(in[0]), in[1], Reduction::mean, 0.1);
      }
      if (cs.scale == 1)
        loss.backward();
      else
        mul(loss, cs.scale).backward();
      std::vector<Tensor> out{loss.detach()};
      for (const Tensor& p : layer.parameters()) out.push_back(p.grad());
      return out;
    };
    const Tensor x = randn({cs.n, cs.k}, {.device = kGpu}, &gen), labels = labels_of(cs.n, c, false, 5);
    std::vector<Tensor> eager;
    const auto names = compiled_as_eager(step, {x, labels}, eager);
    auto count = [&](const char* name) { return count_of(names, name); };
    CHECK(count("kiln_gemm_rowdot_cross_entropy") == 1);
    CHECK(count("kiln_gemm_rowdot") == 0);
    CHECK(count("kiln_softmax_cross_entropy") == 0);
  }
}

// A warm run's shape-only pass plans the fused kernel of the stored choice's launch (not one of
// the alternatives the tuner would time beside it), so after prefetch_kernels the compiled step
// loads it and compiles nothing.
TEST_CASE("a plan holds the fused output layer's kernel of the stored row choice, the one the step runs") {
  const std::int64_t n = 88, k = 120, c = 10;
  const std::string stored = store_row_choice(DType::bf16, n, c, k);
  Generator gen(23);
  nn::Linear layer(k, c, true, &gen);
  layer.to(kGpu);
  auto step = [&](const std::vector<Tensor>& in) {
    layer.zero_grad();
    Tensor loss;
    {
      const AutocastGuard amp(DType::bf16);
      loss = cross_entropy(layer.forward(in[0]), in[1]);
    }
    loss.backward();
    return std::vector<Tensor>{loss.detach()};
  };
  const std::vector<Tensor> in{randn({n, k}, {.device = kGpu}, &gen), labels_of(n, c, false, 9)};
  KernelPlan plan;
  {
    CompiledFunction planned = compile(step);
    plan = plan_kernels([&] { planned(in); }, kGpu);
  }
  std::vector<std::string> fused;
  for (const KernelPlan::Kernel& kernel : plan.kernels)
    if (kernel.label.rfind("gemm rowdot", 0) == 0 && kernel.label.find("cross-entropy") != std::string::npos)
      fused.push_back(kernel.label);
  CHECK(fused == std::vector<std::string>{"gemm " + stored + " cross-entropy"});

  prefetch_kernels(plan, kGpu);
  rt::wait_for_prefetch();
  const std::uint64_t compiled = kernel_stats().compiled;
  CompiledFunction cf = compile(step);
  for (int i = 0; i < 3; ++i) (void)cf(in);
  CHECK(kernel_stats().compiled == compiled);
  REQUIRE(cf.stats().kernel_names_per_graph.size() == 1);
  CHECK(count_of(cf.stats().kernel_names_per_graph[0], "kiln_gemm_rowdot_cross_entropy") == 1);
}

// Over a ReLU layer: the fused kernel writes the output layer's input gradient, masked for the
// ReLU, which the layer's vjp takes (no kernel of its own in the graph); eager runs the row
// input-gradient kernel, whose bits these are, so the step's gradients are eager's.
TEST_CASE("in a compiled step the fused output layer and loss also give the masked input gradient, eager's bits") {
  struct Case {
    DType t;  // f32, or bf16 under autocast
    std::int64_t n, k, hidden;
  };
  for (const Case cs : {Case{DType::f32, 96, 40, 64}, Case{DType::bf16, 128, 48, 256}}) {
    CAPTURE(dtype_name(cs.t));
    const std::int64_t c = 10;
    store_row_choice(cs.t, cs.n, c, cs.hidden);
    Generator gen(22);
    nn::Linear hidden(cs.k, cs.hidden, true, &gen), out(cs.hidden, c, true, &gen);
    hidden.to(kGpu);
    out.to(kGpu);
    auto step = [&](const std::vector<Tensor>& in) {
      hidden.zero_grad();
      out.zero_grad();
      Tensor loss;
      {
        std::optional<AutocastGuard> amp;
        if (cs.t != DType::f32) amp.emplace(cs.t);
        loss = cross_entropy(out.forward(relu(hidden.forward(in[0]))), in[1], Reduction::mean, 0.1);
      }
      loss.backward();
      std::vector<Tensor> r{loss.detach()};
      for (const nn::Linear* m : {&hidden, &out})
        for (const Tensor& p : m->parameters()) r.push_back(p.grad());
      return r;
    };
    const Tensor x = randn({cs.n, cs.k}, {.device = kGpu}, &gen), labels = labels_of(cs.n, c, false, 6);
    std::vector<Tensor> eager;
    const auto names = compiled_as_eager(step, {x, labels}, eager);
    auto count = [&](const char* name) { return count_of(names, name); };
    CHECK(count("kiln_gemm_rowdot_cross_entropy") == 1);
    CHECK(count("kiln_gemm_rowdot_input_grad") == 0);
    CHECK(count("kiln_gemm_ffma") == 0);
    // The hidden layer's weight gradient reads the masked input gradient: it matches the CPU's.
    const Tensor xc = x.to(Device::cpu()), lc = labels.to(Device::cpu());
    std::vector<Tensor> cp;
    for (const nn::Linear* m : {&hidden, &out})
      for (const Tensor& p : m->parameters()) cp.push_back(p.to(Device::cpu()).detach().requires_grad_());
    if (cs.t == DType::f32) {
      // One more step's gradients, from the parameters as they are (no optimizer: unchanged).
      const Tensor h = relu(linear(xc, cp[0], cp[1]));
      cross_entropy(linear(h, cp[2], cp[3]), lc, Reduction::mean, 0.1).backward();
      for (std::size_t i = 0; i < cp.size(); ++i) kiln_test::check_match(cp[i].grad(), eager[i + 1], 1e-4, "grad");
    }
  }
}

TEST_CASE("in bf16 the output layer's gradient kernel sums the ReLU layer's bias gradient, eager and compiled") {
  const std::int64_t n = 256, k = 48, hidden = 128, c = 10;
  store_row_choice(DType::bf16, n, c, hidden);
  Generator gen(23);
  nn::Linear first(k, hidden, true, &gen), out(hidden, c, true, &gen);
  first.to(kGpu);
  out.to(kGpu);
  auto step = [&](const std::vector<Tensor>& in) {
    first.zero_grad();
    out.zero_grad();
    Tensor loss;
    {
      const AutocastGuard amp(DType::bf16);
      loss = cross_entropy(out.forward(first.forward(in[0], Activation::relu)), in[1]);  // as nn::Sequential fuses
    }
    loss.backward();
    std::vector<Tensor> r{loss.detach()};
    for (const nn::Linear* m : {&first, &out})
      for (const Tensor& p : m->parameters()) r.push_back(p.grad());
    return r;
  };
  const Tensor x = randn({n, k}, {.device = kGpu}, &gen), labels = labels_of(n, c, false, 8);
  const std::int64_t taken = linear_detail::ahead_bias_grads_taken();
  const std::vector<Tensor> eager = step({x, labels});
  CHECK(linear_detail::ahead_bias_grads_taken() == taken + 1);
  CompiledFunction cf = compile(step);
  for (int i = 0; i < 3; ++i) {
    const std::vector<Tensor> got = cf({x, labels});
    CAPTURE(i);
    REQUIRE(got.size() == 5);
    // Eager sums the first layer's bias gradient in the same kernel, from the same masked gradient.
    for (std::size_t j = 0; j < got.size(); ++j) CHECK(bits(got[j]) == bits(eager[j]));
  }
  CHECK(linear_detail::ahead_bias_grads_taken() == taken + 3);  // and the compiled eager call's and capture's
  const CompileStats st = cf.stats();
  REQUIRE(st.kernel_names_per_graph.size() == 1);
  CHECK(count_of(st.kernel_names_per_graph[0], "kiln_narrow_linear_grad") == 1);
}
