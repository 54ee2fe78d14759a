// Optimizers on the CPU: SGD/Adam/AdamW steps against PyTorch's update rules written out
// in doubles here, gradients that are missing or do not fit, option checks, state
// checkpoints, learning-rate schedules, a small least-squares fit, and the fused GPU
// kernels compiling for sm_80/sm_90 (no GPU needed).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "backend/cuda/generated/optim/optim_kernels.h"
#include "compile_check.h"
#include "core/tensor/tensor_impl.h"
#include "error_message.h"
#include "kiln/kiln.h"
#include "kiln/runtime/compiler.h"
#include "kiln/runtime/kernel_registry.h"
#include "temp_dir.h"

using namespace kiln;
using kiln_test::message_of;

namespace {

using Vec = std::vector<double>;

Tensor param(const Vec& v, DType t = DType::f64) {
  Tensor p = from_vector(v).to(t);
  p.requires_grad_();
  return p;
}

void set_grad(Tensor& p, const Vec& g) { p.set_grad(from_vector(g).to(p.dtype())); }

// |got - want| <= tol * (1 + |want|) elementwise; tol 0 asks for equality.
void check_close(const Tensor& t, const Vec& want, double tol) {
  const Vec got = t.to_vector<double>();
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CAPTURE(got[i]);
    CAPTURE(want[i]);
    CHECK(std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i])));
  }
}

const Vec kP0{1.0, -2.0, 0.5};
const std::vector<Vec> kGrads{{0.5, -1.0, 2.0}, {0.25, 0.5, -0.125}, {-1.0, 2.0, 0.75}};

// PyTorch's SGD, element by element.
Vec sgd_reference(double lr, double momentum, double dampening, double wd, bool nesterov, int steps) {
  Vec p = kP0, buf(p.size());
  for (int t = 0; t < steps; ++t)
    for (std::size_t i = 0; i < p.size(); ++i) {
      double d = kGrads[t][i] + wd * p[i];
      if (momentum != 0) {
        buf[i] = t == 0 ? d : momentum * buf[i] + (1 - dampening) * d;
        d = nesterov ? d + momentum * buf[i] : buf[i];
      }
      p[i] -= lr * d;
    }
  return p;
}

struct AdamReference {
  Vec p = kP0, m = Vec(3), v = Vec(3);
};

// PyTorch's Adam (L2 decay) or AdamW (decoupled), element by element.
AdamReference adam_reference(double lr, double b1, double b2, double eps, double wd, bool decoupled, int steps) {
  AdamReference r;
  for (int t = 1; t <= steps; ++t)
    for (std::size_t i = 0; i < r.p.size(); ++i) {
      double g = kGrads[t - 1][i];
      if (decoupled) r.p[i] *= 1 - lr * wd;
      else g += wd * r.p[i];
      r.m[i] = b1 * r.m[i] + (1 - b1) * g;
      r.v[i] = b2 * r.v[i] + (1 - b2) * g * g;
      const double m_hat = r.m[i] / (1 - std::pow(b1, t)), v_hat = r.v[i] / (1 - std::pow(b2, t));
      r.p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  return r;
}

template <class Opt, class Options>
Tensor run_steps(const Options& o, int steps, DType t = DType::f64) {
  Tensor p = param(kP0, t);
  Opt opt({p}, o);
  for (int s = 0; s < steps; ++s) {
    set_grad(p, kGrads[s]);
    opt.step();
  }
  CHECK(opt.steps() == steps);
  return p;
}

}  // namespace

TEST_CASE("optim.SGD plain step is p - lr * g") {
  Tensor p = run_steps<optim::SGD>(optim::SgdOptions{.lr = 0.1}, 1);
  check_close(p, {0.95, -1.9, 0.3}, 1e-15);
}

TEST_CASE("optim.SGD with momentum, dampening and weight decay matches PyTorch over three steps") {
  const optim::SgdOptions o{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01};
  check_close(run_steps<optim::SGD>(o, 3), sgd_reference(0.1, 0.9, 0.1, 0.01, false, 3), 1e-13);
  // The first step takes the gradient itself as the buffer, undamped.
  check_close(run_steps<optim::SGD>(o, 1), sgd_reference(0.1, 0, 0, 0.01, false, 1), 1e-13);
}

TEST_CASE("optim.SGD nesterov matches PyTorch over three steps") {
  const optim::SgdOptions o{.lr = 0.05, .momentum = 0.8, .nesterov = true, .weight_decay = 0.1};
  check_close(run_steps<optim::SGD>(o, 3), sgd_reference(0.05, 0.8, 0, 0.1, true, 3), 1e-13);
}

TEST_CASE("optim.SGD in f32, f16 and bf16 follows the f64 values within the dtype's precision") {
  const optim::SgdOptions o{.lr = 0.1, .momentum = 0.9};
  const Vec want = sgd_reference(0.1, 0.9, 0, 0, false, 3);
  check_close(run_steps<optim::SGD>(o, 3, DType::f32), want, 1e-6);
  check_close(run_steps<optim::SGD>(o, 3, DType::f16), want, 4e-3);
  check_close(run_steps<optim::SGD>(o, 3, DType::bf16), want, 3e-2);
}

TEST_CASE("optim.Adam first step moves each parameter by lr against the gradient's sign") {
  // m_hat = g and v_hat = g^2 after one step, so the update is lr * g / (|g| + eps).
  Tensor p = run_steps<optim::Adam>(optim::AdamOptions{.lr = 0.01}, 1);
  check_close(p, {0.99, -1.99, 0.49}, 1e-9);
}

TEST_CASE("optim.Adam and AdamW match PyTorch over three steps") {
  SUBCASE("Adam") {
    const optim::AdamOptions o{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6};
    AdamReference r = adam_reference(0.01, 0.8, 0.95, 1e-6, 0, false, 3);
    Tensor p = param(kP0);
    optim::Adam opt({p}, o);
    for (int s = 0; s < 3; ++s) {
      set_grad(p, kGrads[s]);
      opt.step();
    }
    check_close(p, r.p, 1e-12);
    const nn::NamedTensors st = opt.state();
    REQUIRE(st.size() == 3);
    CHECK(st[0].first == "step");
    CHECK(st[0].second.item<std::int64_t>() == 3);
    CHECK(st[1].first == "0.exp_avg");
    CHECK(st[2].first == "0.exp_avg_sq");
    check_close(st[1].second, r.m, 1e-13);
    check_close(st[2].second, r.v, 1e-13);
  }
  SUBCASE("Adam with L2 weight decay") {
    const optim::AdamOptions o{.lr = 0.02, .weight_decay = 0.1};
    check_close(run_steps<optim::Adam>(o, 3), adam_reference(0.02, 0.9, 0.999, 1e-8, 0.1, false, 3).p, 1e-12);
  }
  SUBCASE("AdamW decays the parameter, not the gradient") {
    const optim::AdamOptions o{.lr = 0.02, .weight_decay = 0.1};
    check_close(run_steps<optim::AdamW>(o, 3), adam_reference(0.02, 0.9, 0.999, 1e-8, 0.1, true, 3).p, 1e-12);
  }
  SUBCASE("f16 parameters keep f32 moments") {
    Tensor p = param(kP0, DType::f16);
    optim::Adam opt({p}, {.lr = 0.01});
    set_grad(p, kGrads[0]);
    opt.step();
    CHECK(p.dtype() == DType::f16);
    for (const auto& [name, t] : opt.state())
      if (name != "step") CHECK(t.dtype() == DType::f32);
    check_close(p, adam_reference(0.01, 0.9, 0.999, 1e-8, 0, false, 1).p, 2e-3);
  }
}

TEST_CASE("optim: parameters without a gradient are untouched and get no state") {
  Tensor a = param(kP0), b = param({3.0, 4.0});
  optim::Adam opt({a, b});
  set_grad(a, kGrads[0]);
  const std::uint64_t va = a.version(), vb = b.version();
  opt.step();
  CHECK(a.version() > va);  // in place, as autograd must see it
  CHECK(b.version() == vb);
  check_close(b, {3.0, 4.0}, 0);
  for (const auto& [name, t] : opt.state()) CHECK(name.rfind("1.", 0) != 0);
  CHECK(opt.state().size() == 3);
}

TEST_CASE("optim: zero_grad drops every gradient") {
  Tensor a = param(kP0), b = param({3.0, 4.0});
  optim::SGD opt({a, b});
  set_grad(a, kGrads[0]);
  set_grad(b, {1.0, 1.0});
  opt.zero_grad();
  CHECK_FALSE(a.grad().defined());
  CHECK_FALSE(b.grad().defined());
  opt.step();  // nothing to do
  check_close(a, kP0, 0);
}

TEST_CASE("optim: a gradient of another dtype or shape is an error naming the optimizer and parameter") {
  Tensor a = param(kP0), b = param({3.0, 4.0});
  optim::Adam opt({a, b});
  set_grad(a, kGrads[0]);
  b.set_grad(from_vector(Vec{1.0, 1.0}).to(DType::f32));
  CHECK(message_of<DTypeError>([&] { opt.step(); }) ==
        "[optim.Adam] parameter 1 has a gradient of dtype f32 but is f64");
  CHECK(opt.steps() == 0);
  check_close(a, kP0, 0);  // checked before anything changes
  b.impl()->grad = from_vector(Vec{1.0, 1.0, 1.0});
  CHECK(message_of<ShapeError>([&] { opt.step(); }) ==
        "[optim.Adam] parameter 1 has a gradient of shape (3,) but is (2,)");
}

TEST_CASE("optim: a non-contiguous gradient is used through a contiguous copy") {
  Tensor p = from_vector(Vec{1, 2, 3, 4}, {2, 2});
  p.requires_grad_();
  optim::SGD opt({p}, {.lr = 1.0});
  Tensor g = transpose(from_vector(Vec{1, 2, 3, 4}, {2, 2}), 0, 1);  // [[1,3],[2,4]]
  REQUIRE_FALSE(g.is_contiguous());
  p.set_grad(g);
  opt.step();
  check_close(p, {0.0, -1.0, 1.0, 0.0}, 0);
}

TEST_CASE("optim: options and parameters are validated") {
  Tensor p = param(kP0);
  CHECK(message_of<ValueError>([&] { optim::Adam({p}, {.beta1 = 1.5}); }) ==
        "[optim.Adam] beta1 must be in [0, 1), got 1.5");
  CHECK(message_of<ValueError>([&] { optim::AdamW({p}, {.beta2 = 1.0}); }) ==
        "[optim.AdamW] beta2 must be in [0, 1), got 1");
  CHECK(message_of<ValueError>([&] { optim::Adam({p}, {.eps = 0}); }) == "[optim.Adam] eps must be finite and > 0, got 0");
  CHECK(message_of<ValueError>([&] { optim::SGD({p}, {.lr = -0.1}); }) ==
        "[optim.SGD] lr must be finite and >= 0, got -0.1");
  CHECK(message_of<ValueError>([&] { optim::SGD({p}, {.nesterov = true}); }) ==
        "[optim.SGD] nesterov needs momentum > 0 and dampening 0, got momentum 0 and dampening 0");
  CHECK_THROWS_AS(optim::SGD({p}, {.momentum = 0.9, .dampening = 0.5, .nesterov = true}), ValueError);
  CHECK_THROWS_AS(optim::SGD({p}, {.weight_decay = -1}), ValueError);

  CHECK(message_of<ValueError>([] { optim::SGD({}, {}); }) == "[optim.SGD] the parameter list is empty");
  CHECK(message_of<ValueError>([&] { optim::SGD({p, p}); }) == "[optim.SGD] parameter 1 is parameter 0 again (or shares its storage)");
  CHECK(message_of<ValueError>([&] { optim::Adam({p, p.detach().requires_grad_()}); }) ==
        "[optim.Adam] parameter 1 is parameter 0 again (or shares its storage)");
  CHECK(message_of<ValueError>([] { optim::SGD({from_vector(Vec{1.0})}); }) ==
        "[optim.SGD] parameter 0 does not require grad");
  CHECK(message_of<ValueError>([&] { optim::SGD({p * 2}); }).find("is not a leaf") != std::string::npos);
  CHECK(message_of<ValueError>([] { optim::SGD({from_vector(std::vector<std::int64_t>{1})}); }) ==
        "[optim.SGD] parameter 0 has dtype i64; parameters are floating");

  optim::SGD opt({p}, {.lr = 0.5});
  CHECK(opt.lr() == 0.5);
  opt.set_lr(0.25);
  CHECK(opt.lr() == 0.25);
  CHECK(message_of<ValueError>([&] { opt.set_lr(-1); }) == "[optim.SGD] lr must be finite and >= 0, got -1");
  CHECK_THROWS_AS(opt.set_lr(std::nan("")), ValueError);
  CHECK(opt.lr() == 0.25);
}

TEST_CASE("optim: state() and load_state() round trip the step count and moments") {
  Tensor a = param(kP0), b = param({3.0, 4.0});
  optim::Adam opt({a, b}, {.lr = 0.01});
  for (int s = 0; s < 2; ++s) {
    set_grad(a, kGrads[s]);
    set_grad(b, {0.5, -0.5});
    opt.step();
  }
  // A fresh optimizer over copies of the parameters, restored, continues identically.
  Tensor a2 = param(a.to_vector<double>()), b2 = param(b.to_vector<double>());
  optim::Adam opt2({a2, b2}, {.lr = 0.01});
  const nn::NamedTensors saved = opt.state();
  CHECK(saved.size() == 5);
  opt2.load_state(saved);
  CHECK(opt2.steps() == 2);
  CHECK_FALSE(opt2.state()[1].second.shares_storage(saved[1].second));  // copies, not aliases
  for (Tensor* p : {&a, &a2}) set_grad(*p, kGrads[2]);
  for (Tensor* p : {&b, &b2}) set_grad(*p, {0.25, 1.0});
  opt.step();
  opt2.step();
  check_close(a2, a.to_vector<double>(), 0);
  check_close(b2, b.to_vector<double>(), 0);
  check_close(opt2.state()[1].second, opt.state()[1].second.to_vector<double>(), 0);
}

TEST_CASE("optim: load_state lists every mismatch in one error and changes nothing") {
  Tensor a = param(kP0), b = param({3.0, 4.0}, DType::f16);
  optim::SGD opt({a, b}, {.momentum = 0.9});
  set_grad(a, kGrads[0]);
  opt.step();
  const nn::NamedTensors bad{
      {"0.momentum_buffer", zeros({2}, {.dtype = DType::f64})},
      {"1.momentum_buffer", zeros({2}, {.dtype = DType::f16})},  // f16 parameters keep f32 state
      {"2.momentum_buffer", zeros({2})},
      {"0.exp_avg", zeros({3}, {.dtype = DType::f64})},
      {"step", scalar_tensor(1.5)},
  };
  const std::string msg = message_of<ValueError>([&] { opt.load_state(bad); });
  CHECK(msg ==
        "[optim.SGD] load_state: 5 mismatches: '0.momentum_buffer' is f64 (2,), expected f64 (3,); "
        "'1.momentum_buffer' is f16 (2,), expected f32 (2,); unexpected entry '2.momentum_buffer'; "
        "unexpected entry '0.exp_avg'; 'step' is f32 (), expected one i64 element");
  CHECK(message_of<ValueError>([&] { opt.load_state({}); }) == "[optim.SGD] load_state: 1 mismatch: 'step' is missing");
  CHECK(opt.steps() == 1);
  CHECK(opt.state().size() == 2);

  // Only "step": the moments are dropped, as a fresh optimizer has none.
  opt.load_state({{"step", scalar_tensor(std::int64_t{7}, {.dtype = DType::i64})}});
  CHECK(opt.steps() == 7);
  CHECK(opt.state().size() == 1);
}

namespace {

Tensor i64_scalar(std::int64_t v) { return scalar_tensor(v, {.dtype = DType::i64}); }

}  // namespace

TEST_CASE("optim: load_state refuses a step count past 2^53, where the bias corrections stop counting") {
  Tensor a = param(kP0);
  optim::Adam opt({a}, {.lr = 0.01});
  constexpr std::int64_t kMax = std::int64_t{1} << 53;
  for (std::int64_t bad : {std::numeric_limits<std::int64_t>::max(), kMax + 1, std::int64_t{-3}}) {
    CAPTURE(bad);
    const std::string msg = message_of<ValueError>([&] { opt.load_state({{"step", i64_scalar(bad)}}); });
    CHECK(msg.find("'step' is " + std::to_string(bad)) != std::string::npos);
    CHECK(msg.find("[optim.Adam] load_state") == 0);
    CHECK(opt.steps() == 0);
  }
  opt.load_state({{"step", i64_scalar(kMax)}});
  CHECK(opt.steps() == kMax);
}

TEST_CASE("optim: a step past 2^53 is an error, not an overflow, and changes nothing") {
  constexpr std::int64_t kMax = std::int64_t{1} << 53;
  Tensor a = param(kP0);
  optim::Adam opt({a}, {.lr = 0.01});
  opt.load_state({{"step", i64_scalar(kMax - 1)}});
  set_grad(a, kGrads[0]);
  opt.step();  // the last step there is
  CHECK(opt.steps() == kMax);
  const Vec before = a.to_vector<double>();
  for (double x : before) CHECK(std::isfinite(x));
  CHECK(message_of<ValueError>([&] { opt.step(); }) ==
        "[optim.Adam] the step count is at its limit 2^53 (9007199254740992); start a new optimizer or load a "
        "smaller 'step'");
  CHECK(opt.steps() == kMax);
  check_close(a, before, 0);
}

TEST_CASE("optim: load_state refuses moments that are not finite and a negative second moment") {
  Tensor a = param(kP0);
  optim::Adam opt({a}, {.lr = 0.01});
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  const std::string msg = message_of<ValueError>([&] {
    opt.load_state({{"step", i64_scalar(3)},
                    {"0.exp_avg", from_vector(Vec{0.1, nan, 0.2})},
                    {"0.exp_avg_sq", from_vector(Vec{0.1, 0.5, -0.25})}});
  });
  CHECK(msg ==
        "[optim.Adam] load_state: 2 mismatches: '0.exp_avg' holds nan at index 1, expected finite values; "
        "'0.exp_avg_sq' holds -0.25 at index 2, expected finite values >= 0");
  CHECK(opt.steps() == 0);
  CHECK(opt.state().size() == 1);

  Tensor b = param({1.0, 2.0}, DType::f16);
  optim::SGD sgd({b}, {.momentum = 0.9});
  CHECK(message_of<ValueError>([&] {
          sgd.load_state({{"step", i64_scalar(1)}, {"0.momentum_buffer", from_vector<float>({1.0f, float(-inf)})}});
        }) == "[optim.SGD] load_state: 1 mismatch: '0.momentum_buffer' holds -inf at index 1, expected finite values");
  // A negative momentum buffer is an ordinary state.
  sgd.load_state({{"step", i64_scalar(1)}, {"0.momentum_buffer", from_vector<float>({1.0f, -2.0f})}});
  CHECK(sgd.steps() == 1);
}

TEST_CASE("io: a checkpoint whose optim.step is INT64_MAX is refused at load, naming the key and value") {
  kiln_test::TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  Generator gen(3);
  nn::Linear net(3, 2, true, &gen);
  optim::Adam opt(net.parameters(), {.lr = 0.01});
  nn::NamedTensors all;
  for (auto& [name, t] : net.state()) all.emplace_back("model." + name, t);
  all.emplace_back("optim.step", i64_scalar(std::numeric_limits<std::int64_t>::max()));
  io::save_safetensors(path, all, {{"format", "kiln-checkpoint"}});

  nn::Linear other(3, 2, true, &gen);
  optim::Adam other_opt(other.parameters(), {.lr = 0.01});
  const Vec w = other.parameters()[0].to(DType::f64).to_vector<double>();
  const std::string msg = message_of<ValueError>([&] { io::load_checkpoint(path, other, &other_opt); });
  CHECK(msg.find("'step' is 9223372036854775807") != std::string::npos);
  CHECK(msg.find(path) != std::string::npos);
  CHECK(other_opt.steps() == 0);
  CHECK(other.parameters()[0].to(DType::f64).to_vector<double>() == w);
}

TEST_CASE("optim.StepLR multiplies by gamma every step_size steps") {
  Tensor p = param(kP0);
  optim::SGD opt({p}, {.lr = 1.0});
  optim::StepLR s(opt, 0.1, 3, 0.5);
  CHECK(opt.lr() == 0.1);
  const Vec want{0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025};
  for (std::size_t k = 0; k < want.size(); ++k) CHECK(s.lr_at(static_cast<std::int64_t>(k)) == doctest::Approx(want[k]));
  CHECK(s.lr_at(30) == doctest::Approx(0.1 * std::pow(0.5, 10)));
  for (int k = 0; k < 4; ++k) s.step();
  CHECK(s.current_step() == 4);
  CHECK(opt.lr() == doctest::Approx(0.05));
  CHECK(message_of<ValueError>([&] { optim::StepLR(opt, 0.1, 0); }) == "[optim.StepLR] step_size must be > 0, got 0");
}

TEST_CASE("optim.CosineLR follows half a cosine to min_lr and stays there") {
  Tensor p = param(kP0);
  optim::SGD opt({p});
  optim::CosineLR s(opt, 0.1, 10, 0.001);
  CHECK(opt.lr() == doctest::Approx(0.1));
  CHECK(s.lr_at(2) == doctest::Approx(0.001 + 0.099 * (1 + std::cos(std::numbers::pi * 0.2)) / 2));
  CHECK(s.lr_at(5) == doctest::Approx(0.0505));
  CHECK(s.lr_at(10) == doctest::Approx(0.001));
  CHECK(s.lr_at(15) == doctest::Approx(0.001));
  s.step();
  CHECK(opt.lr() == doctest::Approx(0.001 + 0.099 * (1 + std::cos(std::numbers::pi * 0.1)) / 2));
  CHECK_THROWS_AS(optim::CosineLR(opt, 0.1, 0), ValueError);
  CHECK_THROWS_AS(optim::CosineLR(opt, 0.1, 10, -1), ValueError);
}

TEST_CASE("optim.OneCycleLR matches PyTorch's first, peak, middle and last values") {
  Tensor p = param(kP0);
  optim::Adam opt({p});
  optim::OneCycleLR s(opt, 0.1, 100);  // pct_start 0.3, div_factor 25, final_div_factor 1e4
  auto cos_anneal = [](double start, double end, double pct) {
    return end + (start - end) / 2.0 * (std::cos(std::numbers::pi * pct) + 1);
  };
  const double initial = 0.1 / 25, final_lr = initial / 1e4;
  CHECK(opt.lr() == doctest::Approx(initial));  // 0.004
  CHECK(s.lr_at(0) == doctest::Approx(0.004));
  CHECK(s.lr_at(10) == doctest::Approx(cos_anneal(initial, 0.1, 10.0 / 29.0)));  // phase 1 ends at 30 - 1
  CHECK(s.lr_at(29) == doctest::Approx(0.1));
  CHECK(s.lr_at(64) == doctest::Approx((0.1 + final_lr) / 2));  // halfway through 29..99
  CHECK(s.lr_at(80) == doctest::Approx(cos_anneal(0.1, final_lr, 51.0 / 70.0)));
  CHECK(s.lr_at(99) == doctest::Approx(4e-7).epsilon(1e-12));
  CHECK(s.lr_at(250) == doctest::Approx(4e-7).epsilon(1e-12));
  s.step();
  CHECK(opt.lr() == doctest::Approx(cos_anneal(initial, 0.1, 1.0 / 29.0)));
  // pct_start * total < 1: the first phase ends before step 0, as in PyTorch.
  optim::OneCycleLR short_warmup(opt, 1.0, 10, 0.05);
  CHECK(short_warmup.lr_at(0) == doctest::Approx(cos_anneal(1.0, 1.0 / 25 / 1e4, 0.5 / 9.5)));
  CHECK(message_of<ValueError>([&] { optim::OneCycleLR(opt, 0.1, 100, 1.5); }) ==
        "[optim.OneCycleLR] pct_start must be in [0, 1], got 1.5");
  CHECK_THROWS_AS(optim::OneCycleLR(opt, 0.1, 0), ValueError);
  CHECK_THROWS_AS(optim::OneCycleLR(opt, 0.1, 100, 0.3, 0), ValueError);
  CHECK_THROWS_AS(s.lr_at(-1), ValueError);
}

TEST_CASE("optim: reset_state starts over in place, so the next steps are a fresh optimizer's") {
  const optim::SgdOptions sgd{.lr = 0.1, .momentum = 0.9, .nesterov = true};
  const optim::AdamOptions adam{.lr = 0.01, .beta1 = 0.7, .beta2 = 0.9};
  auto check = [](optim::Optimizer& opt, Tensor& p, const Tensor& fresh_two_steps) {
    for (int s = 0; s < 3; ++s) {
      set_grad(p, kGrads[static_cast<std::size_t>(s)]);
      opt.step();
    }
    const nn::NamedTensors before = opt.state();
    opt.reset_state();
    CHECK(opt.steps() == 0);
    const nn::NamedTensors after = opt.state();
    REQUIRE(after.size() == before.size());
    for (std::size_t i = 0; i < after.size(); ++i) {
      CAPTURE(after[i].first);
      if (after[i].first == "step") {
        CHECK(after[i].second.item<std::int64_t>() == 0);
        continue;
      }
      CHECK(after[i].second.shares_storage(before[i].second));  // the same buffers, zeroed
      for (double v : after[i].second.to_vector<double>()) CHECK(v == 0.0);
    }
    {
      NoGradGuard no_grad;
      p.copy_(from_vector(kP0));
    }
    for (int s = 0; s < 2; ++s) {
      set_grad(p, kGrads[static_cast<std::size_t>(s)]);
      opt.step();
    }
    CHECK(opt.steps() == 2);
    check_close(p, fresh_two_steps.to_vector<double>(), 0);
  };
  Tensor p1 = param(kP0);
  optim::SGD s1({p1}, sgd);
  check(s1, p1, run_steps<optim::SGD>(sgd, 2));
  Tensor p2 = param(kP0);
  optim::Adam a2({p2}, adam);
  check(a2, p2, run_steps<optim::Adam>(adam, 2));
  // With dampening a zeroed buffer would damp the first gradient, which the first step copies.
  Tensor p3 = param(kP0);
  optim::SGD damped({p3}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.2});
  CHECK(message_of<ValueError>([&] { damped.reset_state(); }).find("[optim.SGD] reset_state: with momentum and "
                                                                    "dampening") == 0);
}

TEST_CASE("optim: LrScheduler::reset goes back to step 0 and sets its lr") {
  Tensor p = param(kP0);
  optim::Adam opt({p});
  optim::OneCycleLR s(opt, 0.1, 100);
  for (int i = 0; i < 5; ++i) s.step();
  CHECK(s.current_step() == 5);
  s.reset();
  CHECK(s.current_step() == 0);
  CHECK(opt.lr() == s.lr_at(0));
  s.step();
  CHECK(opt.lr() == s.lr_at(1));
}

TEST_CASE("optim: LrScheduler::set_step jumps to a step and sets its lr, as stepping there does") {
  Tensor p = param(kP0);
  optim::Adam stepped_opt({p}), jumped_opt({p});
  optim::OneCycleLR stepped(stepped_opt, 0.1, 100), jumped(jumped_opt, 0.1, 100);
  for (int i = 0; i < 37; ++i) stepped.step();
  jumped.set_step(37);
  CHECK(jumped.current_step() == 37);
  CHECK(jumped_opt.lr() == stepped_opt.lr());
  stepped.step();
  jumped.step();
  CHECK(jumped_opt.lr() == stepped_opt.lr());
  CHECK(kiln_test::message_of<ValueError>([&] { jumped.set_step(-1); }) ==
        "[optim.LrScheduler] step must be >= 0, got -1");
  CHECK(jumped.current_step() == 38);
}

TEST_CASE("optim: SGD and Adam drive a least-squares fit to its solution") {
  // X is 6x3 with full column rank; y = X w* exactly, so w* is the minimiser.
  const Tensor x = from_vector(Vec{1, 0, 2, 0, 1, -1, 1, 1, 0, 2, -1, 1, 0, 3, 1, -1, 0.5, 2}, {6, 3});
  const Vec w_star{1.0, -2.0, 0.5};
  const Tensor y = matmul(x, from_vector(w_star, {3, 1}));
  auto fit = [&](auto make_opt, int steps) {
    Tensor w = zeros({3, 1}, {.dtype = DType::f64, .requires_grad = true});
    auto opt = make_opt(w);
    for (int s = 0; s < steps; ++s) {
      Tensor loss = mse_loss(matmul(x, w), y);
      loss.backward();
      opt.step();
      opt.zero_grad();
    }
    return w;
  };
  Tensor w_sgd = fit([](Tensor& w) { return optim::SGD({w}, {.lr = 0.02, .momentum = 0.9, .nesterov = true}); }, 400);
  check_close(w_sgd, w_star, 1e-6);
  Tensor w_adam = fit([](Tensor& w) { return optim::Adam({w}, {.lr = 0.05}); }, 500);
  check_close(w_adam, w_star, 1e-4);
}

TEST_CASE("optim: the fused sgd_step, adam_step and GradScaler kernels compile for sm_80 and sm_90") {
  std::vector<kiln_test::CompileJob> jobs;
  for (const char* op : {"sgd_step", "adam_step", "unscale_grads", "update_scale"}) {
    const rt::KernelSpec* spec = rt::find_kernel(op);
    REQUIRE(spec != nullptr);
    CHECK(spec->dtypes.size() == (std::string(op) == "update_scale" ? 1 : 4));  // the scale update is f32 only
    for (const DTypes& d : spec->dtypes)
      for (int arch : {80, 90}) jobs.push_back({spec, d, 0, arch});
  }
  const kiln_test::CompileSummary r = kiln_test::compile_all(jobs);
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    CAPTURE(jobs[i].spec->op);
    CAPTURE(jobs[i].dtypes.str());
    CHECK_MESSAGE(r.outcomes[i].error.empty(), r.outcomes[i].error);
    CHECK(r.outcomes[i].ptx.find(jobs[i].spec->entry) != std::string::npos);
  }
}

TEST_CASE("optim: a gradient given as a split's rows must match its parameter, or the update refuses it") {
  kernels::OptimTensors ts;
  ts.n[0] = 600;
  kernels::SplitSums sums{.ws = 4096, .rows = 256, .columns = 600, .threads = kernels::kSplitSumThreads, .keep = {}};
  kernels::set_split_sums(ts, 0, sums);
  CHECK(ts.ws[0] == 4096);
  CHECK(ts.rows[0] == 256);
  const std::string expected_start = "[optim] a gradient given as a split's rows needs the parameter's 600 columns";
  auto refused = [&](kernels::SplitSums bad) {
    kernels::OptimTensors other;
    other.n[0] = 600;
    const std::string m = message_of<ValueError>([&] { kernels::set_split_sums(other, 0, bad); });
    CAPTURE(m);
    CHECK(m.rfind(expected_start, 0) == 0);
    CHECK(other.rows[0] == 0);  // nothing set
  };
  kernels::SplitSums narrow = sums;
  narrow.columns = 599;
  refused(narrow);
  kernels::SplitSums no_rows = sums;
  no_rows.rows = 0;
  refused(no_rows);
  kernels::SplitSums too_many = sums;
  too_many.rows = std::int64_t{1} << 31;
  refused(too_many);
  kernels::SplitSums other_block = sums;
  other_block.threads = 128;
  refused(other_block);
}
