// linear with its fused epilogues on cuda:0 against the CPU's plain GEMM and loops: bias and
// ReLU in the product's epilogue, the bias gradient in the weight gradient's epilogue, input
// gradients masked for the ReLU layer below, every float dtype, folded and non-contiguous
// inputs, NaN propagation, autotuned algorithms, and the .grad() buffers written in place inside
// a compiled step.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/registry.h"
#include "gpu_match.h"
#include "kiln/kiln.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/tuning.h"
#include "test_values.h"

using namespace kiln;

namespace {

using kiln_test::kGpu;

double linear_tolerance(DType t) {
  switch (t) {
    case DType::f64:
      return 1e-12;
    case DType::f32:
      return 1e-4;  // sums of up to 300 terms of either sign
    case DType::f16:
      return 4e-3;
    default:
      return 3e-2;  // bf16
  }
}

struct Grads {
  Tensor y, dx, dw, db;
};

// Forward and backward of linear on copies of (x, w, b) on `d`, with a fixed upstream gradient.
Grads run(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& up, Activation act, Device d,
          bool transpose_x = false) {
  Tensor xd = x.to(d), wd = w.to(d).detach().requires_grad_(), bd = b.to(d).detach().requires_grad_();
  if (transpose_x) xd = transpose(transpose(xd, 0, 1).contiguous(), 0, 1);  // same values, column-major
  xd = xd.detach().requires_grad_();
  Tensor y = linear(xd, wd, bd, act);
  sum(mul(y, up.to(d))).backward();
  return {y.detach(), xd.grad(), wd.grad(), bd.grad()};
}

void check_all(const Grads& cpu, const Grads& gpu, double tol, const std::string& what) {
  kiln_test::check_match(cpu.y, gpu.y, tol, what + " y");
  kiln_test::check_match(cpu.dx, gpu.dx, tol, what + " dx");
  kiln_test::check_match(cpu.dw, gpu.dw, tol, what + " dw");
  kiln_test::check_match(cpu.db, gpu.db, tol, what + " db");
}

}  // namespace

TEST_CASE("linear with bias and ReLU on the GPU matches the CPU forward and backward") {
  Generator gen(7);
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16})
    for (Activation act : {Activation::none, Activation::relu})
      for (const Shape& xs : {Shape{64, 48}, Shape{4, 5, 33}, Shape{1, 7}, Shape{300, 129}}) {
        const std::int64_t k = xs.back(), n = 37;
        const Tensor x = randn(xs, {}, &gen).to(dt), w = randn({n, k}, {}, &gen).to(dt),
                     b = randn({n}, {}, &gen).to(dt);
        Shape ys = xs;
        ys.back() = n;
        const Tensor up = randn(ys, {}, &gen).to(dt);
        const std::string what =
            std::string(dtype_name(dt)) + (act == Activation::relu ? " relu " : " none ") + shape_str(xs);
        check_all(run(x, w, b, up, act, Device::cpu()), run(x, w, b, up, act, kGpu), linear_tolerance(dt), what);
        if (xs.size() == 2)
          check_all(run(x, w, b, up, act, Device::cpu()), run(x, w, b, up, act, kGpu, true), linear_tolerance(dt),
                    what + " column-major x");
      }
}

TEST_CASE("linear's ReLU backward and bias gradient in one kernel: relu_backward's bits, the column sums") {
  Generator gen(11);
  for (DType dt : {DType::f32, DType::bf16, DType::f64})
    for (const auto& [m, n] : {std::pair{128, 512}, {1024, 512}, {3, 37}, {700, 40}}) {
      CAPTURE(dtype_name(dt));
      CAPTURE(m);
      const Tensor x = randn({m, 64}, {}, &gen).to(dt).to(kGpu).detach().requires_grad_();
      const Tensor w = randn({n, 64}, {}, &gen).to(dt).to(kGpu).detach().requires_grad_();
      const Tensor b = randn({n}, {}, &gen).to(dt).to(kGpu).detach().requires_grad_();
      const Tensor up = randn({m, n}, {}, &gen).to(dt).to(kGpu);
      const Tensor y = linear(x, w, b, Activation::relu);
      sum(mul(y, up)).backward();
      const Tensor gp = relu_backward(up, y.detach());
      // dx is the same product of the masked gradient: equal bits mean equal masks.
      CHECK(kiln_test::f64_bits(x.grad()) == kiln_test::f64_bits(matmul(gp, w.detach())));
      const Tensor db = sum(gp.to(Device::cpu()).to(DType::f64), {0}, false).to(dt);
      kiln_test::check_match(db, b.grad(), dt == DType::bf16 ? 2e-2 : 1e-5, "db");
    }
}

TEST_CASE("linear's fused ReLU keeps NaN as relu does") {
  Tensor x = zeros({3, 4});
  x.fill_(1.0);
  Tensor row = narrow(x, 0, 1, 1);
  row.fill_(std::numeric_limits<double>::quiet_NaN());
  const Tensor w = ones({2, 4}), b = zeros({2});
  const Tensor fused = linear(x.to(kGpu), w.to(kGpu), b.to(kGpu), Activation::relu);
  const Tensor plain = relu(linear(x, w, b));
  CHECK(std::isnan(plain.to_vector<float>()[2]));
  kiln_test::check_match(plain, fused, 0, "NaN row");
}

TEST_CASE("nn.Sequential runs Linear then ReLU fused, with the unfused results") {
  Generator g1(3), g2(3);
  nn::Sequential fused, plain;
  fused.push_back(nn::Linear(20, 16, true, &g1));
  fused.push_back(nn::ReLU());
  fused.push_back(nn::Linear(16, 3, true, &g1));
  plain.push_back(nn::Linear(20, 16, true, &g2));
  plain.push_back(nn::Flatten());  // breaks the Linear-ReLU pair
  plain.push_back(nn::ReLU());
  plain.push_back(nn::Linear(16, 3, true, &g2));
  fused.to(kGpu);
  plain.to(kGpu);
  Generator gx(5);
  const Tensor x = randn({8, 20}, {.device = kGpu}, &gx);
  const Tensor a = fused(x), b = plain(x);
  kiln_test::check_match(b, a, 1e-5, "logits");
  sum(a).backward();
  sum(b).backward();
  const auto pa = fused.parameters(), pb = plain.parameters();
  REQUIRE(pa.size() == pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i)
    kiln_test::check_match(pb[i].grad(), pa[i].grad(), 1e-5, "grad " + std::to_string(i));
}

TEST_CASE("a compiled step writes linear's weight and bias gradients into the .grad() buffers") {
  Generator gen(2);
  nn::Linear lin(12, 6, true, &gen);
  lin.to(kGpu);
  const Tensor x = randn({5, 12}, {.device = kGpu}, &gen);
  CompiledFunction step = compile([&](const std::vector<Tensor>& in) {
    for (Tensor p : lin.parameters()) p.zero_grad();
    Tensor loss = sum(relu(lin(in[0])));
    loss.backward();
    return std::vector<Tensor>{loss.detach()};
  });
  (void)step({x});  // eager: creates the gradients
  const void* w_grad = lin.weight().grad().data_ptr();
  const void* b_grad = lin.bias().grad().data_ptr();
  for (int i = 0; i < 3; ++i) (void)step({mul(x, 1.0 + i)});
  CHECK(lin.weight().grad().data_ptr() == w_grad);
  CHECK(lin.bias().grad().data_ptr() == b_grad);
  // The last replay's gradients, against eager on the same input.
  const Tensor dw = lin.weight().grad().to(Device::cpu()), db = lin.bias().grad().to(Device::cpu());
  for (Tensor p : lin.parameters()) p.zero_grad();
  sum(relu(lin(mul(x, 3.0)))).backward();
  kiln_test::check_match(lin.weight().grad().to(Device::cpu()), dw.to(kGpu), 0, "dw");
  kiln_test::check_match(lin.bias().grad().to(Device::cpu()), db.to(kGpu), 0, "db");
}

TEST_CASE("linear follows set_allow_tf32 when it changes between calls of one shape") {
  const Tensor x = kiln_test::random_f64({64, 512}, 41).to(DType::f32);
  const Tensor w = kiln_test::random_f64({96, 512}, 42).to(DType::f32);
  const Tensor b = kiln_test::random_f64({96}, 43).to(DType::f32);
  const Tensor want = linear(x.to(DType::f64), w.to(DType::f64), b.to(DType::f64));
  auto max_error = [&] {
    const Tensor got = linear(x.to(kGpu), w.to(kGpu), b.to(kGpu)).to(Device::cpu()).to(DType::f64);
    return max(abs(sub(got, want))).item<double>();
  };
  set_allow_tf32(true);
  const double tf32_error = max_error();  // the shape's first call plans it under TF32
  set_allow_tf32(false);
  const double f32_error = max_error();
  CHECK(f32_error < 1e-4);  // exact f32: sums of 512 products of N(0,1) values
  CHECK(tf32_error > 10 * f32_error);
  set_allow_tf32(true);
  CHECK(max_error() == doctest::Approx(tf32_error).epsilon(0.5));  // and back
  set_allow_tf32(false);
}

TEST_CASE(
    "linear_grads on the GPU (one product with its bias-gradient epilogue, or a product and sums) matches the CPU") {
  // 10 outputs: bf16 takes the plain product and a column sum instead of the epilogue.
  for (std::int64_t outputs : {24, 10})
    for (DType t : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
      CAPTURE(dtype_name(t));
      CAPTURE(outputs);
      Generator g(17);
      // Sums of 300 terms scaled to about 1: the products' partial sums (cuBLASLt may split k)
      // round in the element type, an error relative to the sum's size, not to a cancelled result.
      const Tensor gp = mul(randn({300, outputs}, {}, &g), 1.0 / std::sqrt(300.0)).to(t),
                   x = randn({300, 40}, {.dtype = t}, &g);
      const LinearGrads cpu = linear_grads(gp, x), gpu = linear_grads(gp.to(kGpu), x.to(kGpu));
      kiln_test::check_match(cpu.weight, gpu.weight, linear_tolerance(t), "weight");
      kiln_test::check_match(cpu.bias, gpu.bias, linear_tolerance(t), "bias");
    }
}

namespace {

struct MlpGrads {
  std::vector<Tensor> grads;  // x's, then each layer's weight and bias
};

// Three layers, the first two with ReLU: each upper layer's input gradient may come masked for
// the ReLU layer below (relu_masked_input_grad). With `reread`, the first ReLU's output is also
// read by the loss, so its gradient is a sum and comes unmasked; with `viewed`, each layer reads
// a view of the ReLU's output, so no gradient comes masked (the same forward, unfused backward).
MlpGrads run_mlp(const std::vector<Tensor>& params, const Tensor& x_in, const Tensor& up, Device d, bool reread,
                 bool viewed = false) {
  std::vector<Tensor> p;
  for (const Tensor& t : params) p.push_back(t.to(d).detach().requires_grad_());
  const Tensor x = x_in.to(d).detach().requires_grad_();
  auto in = [viewed](const Tensor& h) { return viewed ? transpose(transpose(h, 0, 1), 0, 1) : h; };
  const Tensor h1 = linear(x, p[0], p[1], Activation::relu);
  const Tensor h2 = linear(in(h1), p[2], p[3], Activation::relu);
  Tensor loss = sum(mul(linear(in(h2), p[4], p[5]), up.to(d)));
  if (reread) loss = add(loss, sum(h1));
  loss.backward();
  MlpGrads g{{x.grad()}};
  for (const Tensor& t : p) g.grads.push_back(t.grad());
  return g;
}

}  // namespace

TEST_CASE("a layer's input gradient comes masked for the ReLU layer below it, with the unmasked gradients") {
  Generator gen(23);
  // f32 twice: exact and on TF32.
  for (int config = 0; config < 3; ++config)
    for (std::int64_t m : {128, 33})
      for (bool reread : {false, true}) {
        const DType dt = config == 2 ? DType::bf16 : DType::f32;
        const bool tf32 = config == 1;
        set_allow_tf32(tf32);
        CAPTURE(config);
        CAPTURE(m);
        CAPTURE(reread);
        const std::int64_t widths[] = {48, 64, 40, 10};
        std::vector<Tensor> params;
        for (int l = 0; l < 3; ++l) {
          params.push_back(mul(randn({widths[l + 1], widths[l]}, {}, &gen), 0.3).to(dt));
          params.push_back(mul(randn({widths[l + 1]}, {}, &gen), 0.3).to(dt));
        }
        const Tensor x = randn({m, widths[0]}, {}, &gen).to(dt), up = randn({m, 10}, {}, &gen).to(dt);
        const MlpGrads gpu = run_mlp(params, x, up, kGpu, reread);
        // The GPU's own unfused backward of the same forward: the masks are the same bits. bf16's
        // rounding of each layer's values moves the CPU's masks near zero, so f32 alone meets it.
        const MlpGrads plain = run_mlp(params, x, up, kGpu, reread, true);
        set_allow_tf32(false);
        for (std::size_t i = 0; i < gpu.grads.size(); ++i)
          kiln_test::check_match(plain.grads[i].to(Device::cpu()), gpu.grads[i], dt == DType::f32 ? 1e-5 : 2e-2,
                                 "unfused grad " + std::to_string(i));
        if (dt != DType::f32 || tf32) continue;
        const MlpGrads cpu = run_mlp(params, x, up, Device::cpu(), reread);
        for (std::size_t i = 0; i < cpu.grads.size(); ++i)
          kiln_test::check_match(cpu.grads[i], gpu.grads[i], 1e-4, "grad " + std::to_string(i));
      }
}

TEST_CASE("relu_masked_input_grad: the product's bits where the ReLU's output is > 0, zeros elsewhere") {
  Generator gen(29);
  for (DType dt : {DType::f32, DType::bf16})
    for (const std::array<std::int64_t, 3>& mnk :
         {std::array<std::int64_t, 3>{128, 10, 512}, {128, 512, 784}, {96, 10, 40}}) {
      const std::int64_t m = mnk[0], n = mnk[1], k = mnk[2];
      CAPTURE(dtype_name(dt));
      CAPTURE(n);
      const Tensor gp = randn({m, n}, {}, &gen).to(dt).to(kGpu), w = randn({n, k}, {}, &gen).to(dt).to(kGpu);
      const Tensor y = randn({m, k}, {}, &gen).to(dt).to(kGpu);
      const Tensor in[] = {gp, w, y};
      const Tensor masked = dispatch(*find_op("relu_masked_input_grad"), in)[0];
      const Tensor want = relu_backward(matmul(gp, w), y);
      // The masked product may run another algorithm than the plain one: their sums may round apart.
      kiln_test::check_match(want, masked, dt == DType::f32 ? 1e-5 : 2e-2, "masked");
      const std::vector<double> got = masked.to(Device::cpu()).to_vector<double>(),
                                ys = y.to(Device::cpu()).to_vector<double>();
      std::size_t zeros_where_masked = 0, masked_count = 0;
      for (std::size_t i = 0; i < ys.size(); ++i)
        if (!(ys[i] > 0)) ++masked_count, zeros_where_masked += got[i] == 0.0;
      CHECK(masked_count > 0);
      CHECK(zeros_where_masked == masked_count);
    }
}

// dW = gp^T x and db = gp's column sums in f64 from the same bf16 values, for the narrow kernel.
std::vector<Tensor> narrow_reference(const Tensor& gp, const Tensor& x) {
  const Tensor g64 = gp.to(Device::cpu()).to(DType::f64), x64 = x.to(Device::cpu()).to(DType::f64);
  return {matmul(transpose(g64, 0, 1), x64), sum(g64, {0}, false)};
}

// linear_grad_wb, and linear_grad_wb_below with the layer below's gradient (its column sums too).
TEST_CASE("a narrow bf16 layer's weight and bias gradients in one kernel: the f64 sums, the same bits every call") {
  Generator gen(31);
  for (bool below : {false, true})
    for (bool f32_grads : {false, true})
      for (const std::array<std::int64_t, 3>& mnk : {std::array<std::int64_t, 3>{256, 10, 256},
                                                     {256, 10, 128},
                                                     {1000, 3, 40},
                                                     {7, 15, 33},
                                                     {9, 1, 70},
                                                     {0, 10, 20}}) {
        const std::int64_t m = mnk[0], n = mnk[1], k = mnk[2];
        CAPTURE(below);
        CAPTURE(f32_grads);
        CAPTURE(m);
        CAPTURE(n);
        const Tensor gp = randn({m, n}, {}, &gen).to(DType::bf16).to(kGpu),
                     x = randn({m, k}, {}, &gen).to(DType::bf16).to(kGpu),
                     g_below = randn({m, k}, {}, &gen).to(DType::bf16).to(kGpu);
        const std::vector<Tensor> in = below ? std::vector<Tensor>{gp, x, g_below} : std::vector<Tensor>{gp, x};
        const OpDef& op = *find_op(below ? "linear_grad_wb_below" : "linear_grad_wb");
        const Attrs attrs = f32_grads ? Attrs{{"f32_grads", true}} : Attrs{};
        const std::vector<Tensor> got = dispatch(op, in, attrs);
        const std::vector<Tensor> again = dispatch(op, in, attrs);
        const DType out = f32_grads ? DType::f32 : DType::bf16;
        REQUIRE(got.size() == in.size());
        CHECK(got[0].dtype() == out);
        std::vector<Tensor> want = narrow_reference(gp, x);
        if (below) want.push_back(sum(g_below.to(Device::cpu()).to(DType::f64), {0}, false));
        // f32 sums of exact products of up to 1000 terms; bf16 results round to 8 bits.
        const double tol = f32_grads ? 1e-4 : 1e-2;
        const char* names[] = {"dw", "db", "db below"};
        for (std::size_t i = 0; i < got.size(); ++i) {
          CHECK(got[i].dtype() == out);
          kiln_test::check_match(want[i].to(out), got[i], tol, names[i]);
          CHECK(kiln_test::f64_bits(got[i]) == kiln_test::f64_bits(again[i]));
        }
      }
}

TEST_CASE("a compiled mlp step masks input gradients in their products: no ReLU layer runs its own mask") {
  // The first layer has no input gradient: its bias gradient is summed on the chain beside its
  // weight product (linear_grad_wb's bias_on_chain). Exact f32 masks the output layer's (k = 10:
  // the row input-gradient kernel) always, and the second layer's only where the FFMA kind is
  // timed for the masked product (input_grad's mask_pays): under KILN_TUNE=auto on sm_90.
  const struct RestoreTune {
    rt::TuneMode was = rt::tune_mode();
    ~RestoreTune() { rt::set_tune_mode(was); }
  } restore;
  const bool sm90 = rt::device_info(0).arch() >= 90;
  struct Case {
    std::optional<DType> amp;
    rt::TuneMode tune;
    int masked;
  };
  for (const Case& k :
       {Case{DType::bf16, rt::TuneMode::auto_, 2}, Case{std::nullopt, rt::TuneMode::auto_, sm90 ? 2 : 1},
        Case{std::nullopt, rt::TuneMode::off, 1}}) {
    CAPTURE(k.amp.has_value());
    CAPTURE(k.masked);
    rt::set_tune_mode(k.tune);
    Generator gen(31);
    auto model = std::make_shared<nn::Sequential>();
    model->push_back(nn::Linear(48, 64, true, &gen));
    model->push_back(nn::ReLU());
    model->push_back(nn::Linear(64, 40, true, &gen));
    model->push_back(nn::ReLU());
    model->push_back(nn::Linear(40, 10, true, &gen));
    model->to(kGpu);
    optim::SGD opt(model->parameters(), optim::SgdOptions{.lr = 1e-2});
    CompiledFunction step = compile([&](const std::vector<Tensor>& in) {
      opt.zero_grad();
      Tensor loss;
      {
        const AutocastGuard guard(k.amp);
        loss = cross_entropy((*model)(in[0]), in[1]);
      }
      loss.backward();
      opt.step();
      return std::vector<Tensor>{loss.detach()};
    });
    const Tensor x = randn({128, 48}, {.device = kGpu}, &gen), labels = randint(0, 10, {128}, {.device = kGpu}, &gen);
    const KernelPlan plan = plan_kernels([&] { step({x, labels}); }, kGpu);
    REQUIRE(plan.steps.size() == 1);
    int masked = 0, relu_masks = 0;
    for (const KernelPlan::Group& g : plan.steps[0].groups)
      for (const std::string& op : g.ops) {
        masked += op == "relu_masked_input_grad";
        relu_masks += op == "relu_backward_bias_grad" || op == "relu_backward";
      }
    CHECK(masked == k.masked);          // of the second and third layers' input gradients
    CHECK(relu_masks == 2 - k.masked);  // each ReLU's mask, in a product or on its own
  }
}
