// GradScaler on the CPU: the scale schedule (growth after growth_interval clean steps, backoff
// on inf/NaN), unscaled gradients, skipped steps, its misuse errors and state, and
// Optimizer::step_unless (its kernels compile in test_optim.cpp).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "error_message.h"
#include "kiln/kiln.h"
#include "test_values.h"

using namespace kiln;
using kiln_test::message_of;

namespace {
using kiln_test::kInf;

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

// A leaf parameter, f32 unless asked.
Tensor f32_param(std::vector<double> v, DType t = DType::f32) {
  Tensor p = from_vector(v).to(t);
  p.requires_grad_();
  return p;
}

// loss = sum(g * p), so p's gradient is g * the scale after scaler.scale(loss).backward().
void backward_scaled(optim::GradScaler& scaler, const Tensor& p, const std::vector<double>& g) {
  Tensor loss = sum(mul(p, from_vector(g).to(p.dtype())));
  scaler.scale(loss).backward();
}

}  // namespace

TEST_CASE("GradScaler: gradients come back unscaled and the step uses them") {
  Tensor p = f32_param({1.0, 2.0, -3.0});
  optim::SGD opt({p}, {.lr = 0.5});
  optim::GradScaler scaler({.init_scale = 1024});
  backward_scaled(scaler, p, {0.25, -0.5, 1.0});
  CHECK(p.grad().to_vector<double>() == std::vector<double>{256, -512, 1024});
  scaler.step(opt);
  CHECK(p.grad().to_vector<double>() == std::vector<double>{0.25, -0.5, 1.0});
  CHECK(p.to_vector<double>() == std::vector<double>{0.875, 2.25, -3.5});
  CHECK(scaler.found_inf(opt).item<float>() == 0.f);
  scaler.update();
  CHECK(scaler.scale_value() == 1024);
  CHECK(scaler.growth_tracker() == 1);
  CHECK(opt.steps() == 1);
}

TEST_CASE("GradScaler: inf or NaN skips the step and backs off; growth_interval clean steps grow the scale") {
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    CAPTURE(dtype_name(t));
    Tensor p = f32_param({1.0, -1.0}, t);
    optim::Adam opt({p}, {.lr = 0.1});
    optim::GradScaler scaler({.init_scale = 8, .growth_interval = 3});
    auto iteration = [&](const std::vector<double>& g) {
      opt.zero_grad();
      backward_scaled(scaler, p, g);
      scaler.step(opt);
      scaler.update();
    };
    iteration({1, 1});
    iteration({1, 1});
    CHECK(scaler.scale_value() == 8);
    CHECK(scaler.growth_tracker() == 2);
    iteration({1, 1});  // the third clean step in a row
    CHECK(scaler.scale_value() == 16);
    CHECK(scaler.growth_tracker() == 0);
    CHECK(opt.steps() == 3);

    const std::vector<double> before = p.to_vector<double>();
    for (double bad : {kInf, kNan}) {
      iteration({1, bad});
      CHECK(scaler.found_inf(opt).item<float>() != 0.f);
      CHECK(p.to_vector<double>() == before);  // untouched, Adam's moments too (checked below)
      CHECK(opt.steps() == 3);
    }
    CHECK(scaler.scale_value() == 4);
    CHECK(scaler.growth_tracker() == 0);
    iteration({1, 1});
    CHECK(opt.steps() == 4);
    CHECK(p.to_vector<double>() != before);
    CHECK(scaler.growth_tracker() == 1);
    for (const auto& [name, s] : opt.state())
      if (name != "step") CHECK(std::isfinite(sum(s).item<double>()));
  }
}

TEST_CASE("GradScaler: a huge scale that would overflow f32 stays put; a gradient that overflows is caught") {
  const double big = std::ldexp(1.0, 127);
  Tensor p = f32_param({1.0});
  optim::SGD opt({p}, {.lr = 0.1});
  optim::GradScaler scaler({.init_scale = big, .growth_interval = 1});
  backward_scaled(scaler, p, {1.0});
  scaler.step(opt);
  scaler.update();
  CHECK(scaler.scale_value() == big);  // 2^128 is not a finite f32
  // 4 * 2^127 overflows the scaled f32 gradient to inf: skipped, backed off.
  opt.zero_grad();
  backward_scaled(scaler, p, {4.0});
  scaler.step(opt);
  scaler.update();
  CHECK(scaler.scale_value() == big / 2);
  CHECK(opt.steps() == 1);
}

TEST_CASE("GradScaler: each optimizer skips on its own gradients; update backs off when any was bad") {
  Tensor a = f32_param({1.0}), b = f32_param({1.0});
  optim::SGD opt_a({a}, {.lr = 1}), opt_b({b}, {.lr = 1});
  optim::GradScaler scaler({.init_scale = 2});
  scaler.scale(sum(mul(a, 3.0)) + sum(mul(b, kInf))).backward();
  scaler.step(opt_a);
  scaler.step(opt_b);
  scaler.update();
  CHECK(a.item<float>() == -2.f);
  CHECK(b.item<float>() == 1.f);
  CHECK(scaler.scale_value() == 1);
}

TEST_CASE("GradScaler: misuse and bad options are ValueErrors naming the scaler") {
  Tensor p = f32_param({1.0});
  optim::SGD opt({p});
  optim::GradScaler scaler;
  CHECK(message_of<ValueError>([&] { scaler.update(); }).find("[optim.GradScaler] update() found no gradients") == 0);
  backward_scaled(scaler, p, {1});
  scaler.unscale(opt);
  CHECK(message_of<ValueError>([&] { scaler.unscale(opt); }).find("unscale() was called") != std::string::npos);
  scaler.step(opt);  // after an explicit unscale: no second division
  CHECK(p.grad().item<float>() == 1.f);
  CHECK(message_of<ValueError>([&] { scaler.step(opt); }).find("step() was called") != std::string::npos);
  scaler.update();

  using O = optim::GradScalerOptions;
  for (const O& bad : {O{.init_scale = 0}, O{.init_scale = kInf}, O{.growth_factor = 1}, O{.backoff_factor = 1},
                       O{.backoff_factor = 0}, O{.growth_interval = 0}}) {
    const std::string msg = message_of<ValueError>([&] { optim::GradScaler s(bad); });
    CHECK(msg.rfind("[optim.GradScaler] ", 0) == 0);
  }
  CHECK_THROWS_AS(scaler.scale(from_vector(std::vector<std::int64_t>{1})), DTypeError);
}

TEST_CASE("GradScaler: disabled, it is the plain step") {
  Tensor p = f32_param({1.0});
  optim::SGD opt({p}, {.lr = 1});
  optim::GradScaler scaler({.enabled = false});
  Tensor loss = sum(mul(p, 2.0));
  CHECK(scaler.scale(loss).impl() == loss.impl());
  loss.backward();
  scaler.step(opt);
  scaler.update();
  CHECK(p.item<float>() == -1.f);
}

TEST_CASE("GradScaler: state round-trips and bad state changes nothing") {
  Tensor p = f32_param({1.0});
  optim::SGD opt({p});
  optim::GradScaler a({.init_scale = 32, .growth_interval = 10});
  backward_scaled(a, p, {1});
  a.step(opt);
  a.update();
  optim::GradScaler b;
  b.load_state(a.state());
  CHECK(b.scale_value() == 32);
  CHECK(b.growth_tracker() == 1);
  const std::string msg = message_of<ValueError>([&] {
    b.load_state(
        {{"scale", scalar_tensor(-1.0)}, {"growth_tracker", scalar_tensor(std::int64_t{-2})}, {"x", Tensor()}});
  });
  CHECK(msg.find("[optim.GradScaler] load_state: ") == 0);
  CHECK(msg.find("'scale'") != std::string::npos);
  CHECK(msg.find("'growth_tracker'") != std::string::npos);
  CHECK(msg.find("'x'") != std::string::npos);
  CHECK(message_of<ValueError>([&] {
          b.load_state({{"scale", scalar_tensor(2.0)}});
        }).find("missing") != std::string::npos);
  CHECK(b.scale_value() == 32);
}

TEST_CASE("Optimizer::step_unless on the CPU: a set flag skips everything, a clear one steps") {
  Tensor p = f32_param({1.0, 2.0});
  optim::SGD opt({p}, {.lr = 1});
  p.set_grad(from_vector(std::vector<float>{1, 1}));
  opt.step_unless(scalar_tensor(1.0));
  CHECK(p.to_vector<double>() == std::vector<double>{1, 2});
  CHECK(opt.steps() == 0);
  opt.step_unless(scalar_tensor(0.0));
  CHECK(p.to_vector<double>() == std::vector<double>{0, 1});
  CHECK(opt.steps() == 1);
  CHECK_THROWS_AS(opt.step_unless(scalar_tensor(0.0, {.dtype = DType::f64})), DTypeError);
}
