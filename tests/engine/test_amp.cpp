// Autocast on the CPU: the dtypes outputs and gradients get under an AutocastGuard (matmul,
// linear and conv2d in bf16/f16, softmax and the losses in f32), f32 master weights, nesting
// and restore, f64 left alone, and backward() unaffected by the scope it runs in.
#include <doctest/doctest.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "error_message.h"
#include "kiln/amp.h"
#include "kiln/kiln.h"

using namespace kiln;
using kiln_test::message_of;

namespace {

Tensor random_leaf(const Shape& shape, std::uint64_t seed, DType t = DType::f32) {
  Generator gen(seed);
  Tensor p = randn(shape, {}, &gen).to(t);
  p.requires_grad_();
  return p;
}

// max |a - b| <= tol * (1 + max |b|), both read as f64.
void check_close(const Tensor& a, const Tensor& b, double tol) {
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  REQUIRE(x.size() == y.size());
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    err = std::max(err, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  CAPTURE(err);
  CHECK(err <= tol * (1 + scale));
}

}  // namespace

TEST_CASE("autocast: the guard nests, restores, turns off with nullopt and refuses other dtypes") {
  CHECK_FALSE(autocast_dtype().has_value());
  {
    AutocastGuard outer(DType::bf16);
    CHECK(autocast_dtype() == DType::bf16);
    {
      AutocastGuard inner(DType::f16);
      CHECK(autocast_dtype() == DType::f16);
      {
        AutocastGuard off(std::nullopt);
        CHECK_FALSE(autocast_dtype().has_value());
      }
      CHECK(autocast_dtype() == DType::f16);
    }
    CHECK(autocast_dtype() == DType::bf16);
    const std::string msg = message_of<DTypeError>([] { AutocastGuard bad(DType::f64); });
    CHECK(msg.rfind("[autocast]", 0) == 0);
    CHECK(msg.find("f64") != std::string::npos);
    CHECK(autocast_dtype() == DType::bf16);  // a refused guard changes nothing
  }
  CHECK_FALSE(autocast_dtype().has_value());
}

TEST_CASE("autocast: linear runs in bf16 and f16 while f32 master weights get f32 gradients") {
  for (DType t : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(t));
    Tensor x = random_leaf({4, 6}, 1), w = random_leaf({3, 6}, 2), b = random_leaf({3}, 3);
    Tensor y;
    {
      AutocastGuard amp(t);
      y = linear(x, w, b);
    }
    CHECK(y.dtype() == t);
    CHECK(w.dtype() == DType::f32);
    sum(cast(y, DType::f32)).backward();
    for (const Tensor* p : {&x, &w, &b}) {
      REQUIRE(p->grad().defined());
      CHECK(p->grad().dtype() == DType::f32);
    }
    // Close to the f32 result: the inputs lose their low bits, the sums do not.
    NoGradGuard no_grad;
    check_close(cast(y, DType::f32), linear(x, w, b), 3e-2);
    check_close(b.grad(), full({3}, 4.0), 0);
  }
}

TEST_CASE("autocast: matmul and conv2d run in the autocast dtype; f64 inputs are left alone") {
  Tensor a = random_leaf({2, 3, 5}, 4), m = random_leaf({5, 4}, 5);
  Tensor x = random_leaf({2, 3, 6, 6}, 6), k = random_leaf({4, 3, 3, 3}, 7), kb = random_leaf({4}, 8);
  Tensor y, c;
  {
    AutocastGuard amp(DType::bf16);
    y = matmul(a, m);
    c = conv2d(x, k, kb, {.padding = {1}});
  }
  CHECK(y.dtype() == DType::bf16);
  CHECK(c.dtype() == DType::bf16);
  CHECK(c.shape() == Shape{2, 4, 6, 6});
  (sum(cast(y, DType::f32)) + sum(cast(c, DType::f32))).backward();
  for (const Tensor* p : {&a, &m, &x, &k, &kb}) {
    REQUIRE(p->grad().defined());
    CHECK(p->grad().dtype() == DType::f32);
  }
  {
    NoGradGuard no_grad;
    check_close(cast(c, DType::f32), conv2d(x, k, kb, {.padding = {1}}), 3e-2);
  }

  Tensor a64 = random_leaf({3, 5}, 9, DType::f64), m64 = random_leaf({5, 2}, 10, DType::f64);
  AutocastGuard amp(DType::f16);
  CHECK(matmul(a64, m64).dtype() == DType::f64);
  CHECK(linear(a64, random_leaf({2, 5}, 11, DType::f64)).dtype() == DType::f64);
  CHECK(conv2d(random_leaf({1, 3, 4, 4}, 12, DType::f64), random_leaf({2, 3, 3, 3}, 13, DType::f64)).dtype() == DType::f64);
  // Integer and already-low inputs are not touched either.
  CHECK(matmul(random_leaf({2, 2}, 14, DType::bf16), random_leaf({2, 2}, 15, DType::bf16)).dtype() == DType::bf16);
}

TEST_CASE("autocast: softmax, log_softmax and the losses compute in f32") {
  Tensor logits = random_leaf({4, 5}, 20, DType::bf16);
  Tensor labels = from_vector(std::vector<std::int64_t>{0, 3, 1, 4});
  // Outside a scope a bf16 input gives a bf16 output.
  CHECK(softmax(logits, 1).dtype() == DType::bf16);
  AutocastGuard amp(DType::bf16);
  CHECK(softmax(logits, 1).dtype() == DType::f32);
  CHECK(log_softmax(logits, 1).dtype() == DType::f32);
  CHECK(nll_loss(log_softmax(logits, 1), labels).dtype() == DType::f32);
  CHECK(mse_loss(logits, logits).dtype() == DType::f32);
  CHECK(mse_loss(logits, random_leaf({4, 5}, 21)).dtype() == DType::f32);
  CHECK(cross_entropy(random_leaf({4, 5, 2}, 22, DType::f16), from_vector(std::vector<std::int64_t>(8, 1), {4, 2})).dtype() ==
        DType::f32);
  Tensor loss = cross_entropy(logits, labels);
  CHECK(loss.dtype() == DType::f32);
  loss.backward();
  // The gradient comes back in the input's dtype.
  REQUIRE(logits.grad().defined());
  CHECK(logits.grad().dtype() == DType::bf16);
  // f64 stays f64.
  CHECK(softmax(random_leaf({2, 3}, 23, DType::f64), 1).dtype() == DType::f64);
}

// 16-bit logits of (N, C) reach the fused cross-entropy uncast: its f32 loss is the one of the
// logits cast to f32, and their gradient that one's, rounded once to the logits' dtype (the cast
// path rounds to f32 first, so it may differ by one 16-bit rounding).
TEST_CASE("autocast: cross_entropy of bf16 and f16 logits keeps the cast path's loss, without the cast") {
  const Tensor labels = from_vector(std::vector<std::int64_t>{0, 3, 2, 1, 4, 3, -100}, {7});
  for (DType t : {DType::bf16, DType::f16})
    for (Reduction r : {Reduction::none, Reduction::mean}) {
      CAPTURE(dtype_name(t));
      Tensor fused = random_leaf({7, 5}, 24, t), cast_first = random_leaf({7, 5}, 24, t);
      Tensor loss;
      {
        AutocastGuard amp(t);
        loss = cross_entropy(fused, labels, r, 0.1, -100);
      }
      const Tensor want = cross_entropy(cast(cast_first, DType::f32), labels, r, 0.1, -100);
      CHECK(loss.dtype() == DType::f32);
      CHECK(loss.to_vector<float>() == want.to_vector<float>());
      sum(loss).backward();
      sum(want).backward();
      REQUIRE(fused.grad().dtype() == t);
      const std::vector<double> got = fused.grad().to(DType::f64).to_vector<double>();
      const std::vector<double> ref = cast_first.grad().to(DType::f64).to_vector<double>();
      for (std::size_t i = 0; i < got.size(); ++i) CHECK(std::fabs(got[i] - ref[i]) <= std::ldexp(std::fabs(ref[i]), -7));
    }
}

TEST_CASE("autocast: a small net under the guard trains its f32 weights like f32 does") {
  Generator gen(30);
  nn::Sequential net{nn::Linear(8, 16, true, &gen), nn::ReLU(), nn::Linear(16, 3, true, &gen)};
  Tensor x = randn({32, 8}, {}, &gen);
  Tensor y = randint(0, 3, {32}, {}, &gen);
  optim::SGD opt(net.parameters(), {.lr = 0.5});
  double first = 0, last = 0;
  for (int i = 0; i < 30; ++i) {
    opt.zero_grad();
    Tensor loss;
    {
      AutocastGuard amp(DType::bf16);
      loss = cross_entropy(net(x), y);
    }
    CHECK(loss.dtype() == DType::f32);
    loss.backward();
    for (const Tensor& p : net.parameters()) CHECK(p.grad().dtype() == DType::f32);
    opt.step();
    (i == 0 ? first : last) = loss.item<double>();
  }
  for (const Tensor& p : net.parameters()) CHECK(p.dtype() == DType::f32);
  CHECK(last < 0.5 * first);
}

TEST_CASE("autocast: backward runs with autocast off, whatever scope calls it") {
  auto grads = [](bool in_scope) {
    Tensor a = random_leaf({3, 4}, 40), b = random_leaf({4, 2}, 41);
    Tensor y = matmul(a, b);  // recorded in f32
    std::optional<AutocastGuard> amp;
    if (in_scope) amp.emplace(DType::f16);
    sum(mul(y, y)).backward();
    return std::vector<Tensor>{a.grad(), b.grad()};
  };
  const std::vector<Tensor> plain = grads(false), scoped = grads(true);
  for (std::size_t i = 0; i < plain.size(); ++i) {
    CHECK(scoped[i].dtype() == DType::f32);
    check_close(scoped[i], plain[i], 0);  // exactly: no f16 matmul in the vjp
  }
}
