// Autograd: gradients against finite differences, accumulation, retain_graph,
// NoGradGuard, detach, in-place detection, broadcasting reduced in backward.
#include <doctest/doctest.h>

#include <limits>

#include "error_message.h"

#include "gradcheck.h"
#include "kiln/kiln.h"
#include "test_values.h"

using namespace kiln;
using kiln::testing::gradcheck;

namespace {
using kiln_test::f64;
using kiln_test::leaf;
using kiln_test::message_of;

}  // namespace

TEST_CASE("gradients of compositions match finite differences") {
  Tensor a = f64({0.5, -1.2, 2.0, 0.3, 1.1, -0.7}, {2, 3});
  Tensor b = f64({1.5, 0.8, -2.2}, {3});
  Tensor c = f64({0.9, 1.7}, {2, 1});
  auto f = [](const std::vector<Tensor>& x) {
    Tensor y = x[0] * x[1] - x[2] / (x[1] * x[1] + 1.0);  // broadcasting (2,3) with (3,) and (2,1)
    return sum(y * y, {1}) + 3.0 * sum(y) - 2.0 / (x[2] + 4.0).reshape({2});
  };
  auto r = gradcheck(f, {a, b, c});
  CHECK_MESSAGE(r.ok, r.message);
  auto r2 = gradcheck([](const auto& x) { return neg(sum(x[0] - 1.5, {0}, true)) * x[0]; }, {a});
  CHECK_MESSAGE(r2.ok, r2.message);
}

TEST_CASE("gradcheck notices a wrong gradient") {
  // x * detach(x): backward sees only one factor, so the check must fail.
  auto r = gradcheck([](const auto& x) { return x[0] * x[0].detach(); }, {f64({1, 2, 3}, {3})});
  CHECK_FALSE(r.ok);
}

TEST_CASE("every differentiable registry op passes gradcheck on the CPU") {
  int checked = 0;
  for (const OpDef* op : registered_ops()) {
    if (!op->vjp || !op->test.gradcheck) continue;
    auto failures = kiln::testing::gradcheck_op(*op);
    for (const auto& f : failures) FAIL_CHECK(f);
    ++checked;
  }
  CHECK(checked >= 12);
}

TEST_CASE("backward on a scalar accumulates into .grad over two calls") {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor y = sum(x * x);
  y.backward({.retain_graph = true});
  CHECK(x.grad().to_vector<double>() == std::vector<double>{2, 4, 6});
  y.backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{4, 8, 12});
  x.zero_grad();
  CHECK_FALSE(x.grad().defined());
  CHECK(x.is_leaf());
  CHECK_FALSE(y.is_leaf());
  CHECK(y.grad_fn()->name() == "sum");
}

TEST_CASE("backward with an explicit gradient") {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = x * 3.0;
  CHECK_THROWS_AS(y.backward(), ShapeError);  // two elements: a gradient is needed
  y.backward(f64({1, 10}, {2}));
  CHECK(x.grad().to_vector<double>() == std::vector<double>{3, 30});
  CHECK_THROWS_AS(f64({1}, {1}).backward(), ValueError);  // nothing requires grad
}

TEST_CASE("a second backward through a freed graph names the op unless retain_graph") {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = sum(x * x);
  y.backward();
  std::string msg = message_of<Error>([&] { y.backward(); });
  CHECK(msg.find("[autograd] backward through sum a second time") == 0);
  CHECK(msg.find("retain_graph") != std::string::npos);

  Tensor z = sum(x * x);
  z.backward({.retain_graph = true});
  z.backward({.retain_graph = true});
  CHECK(x.grad().to_vector<double>() == std::vector<double>{6, 12});
  // Saved tensors are freed after backward without retain_graph.
  Tensor w = sum(x * x);
  CHECK_FALSE(w.grad_fn()->next_edges()[0].node->saved_inputs().empty());
  w.backward();
  CHECK(w.grad_fn()->next_edges()[0].node->saved_inputs().empty());
  CHECK(w.grad_fn()->released());
}

TEST_CASE("NoGradGuard and detach keep ops out of the graph") {
  Tensor x = leaf({1, 2}, {2});
  {
    NoGradGuard guard;
    CHECK_FALSE(grad_enabled());
    Tensor y = x * 2.0;
    CHECK_FALSE(y.requires_grad());
    CHECK(y.grad_fn() == nullptr);
  }
  CHECK(grad_enabled());
  Tensor d = x.detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(d.shares_storage(x));
  Tensor y = sum(x * d);
  y.backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{1, 2});  // d is a constant
}

TEST_CASE("in-place modification of a saved tensor is detected") {
  Tensor x = leaf({1, 2}, {2});
  Tensor h = x * 2.0;     // saves nothing
  Tensor y = sum(h * h);  // saves h
  h.add_(1.0);            // h's storage version moves on
  std::string msg = message_of<Error>([&] { y.backward(); });
  CHECK(msg.find("input 0 of mul, saved for backward, was modified in place") != std::string::npos);

  // In place on a leaf that requires grad is refused outright.
  CHECK(message_of<ValueError>([&] { x.add_(1.0); }).starts_with("[add_] a leaf tensor that requires grad"));
  {
    NoGradGuard g;  // the optimizer's way
    x.sub_(0.5);
  }
  CHECK(x.to_vector<double>() == std::vector<double>{0.5, 1.5});
}

TEST_CASE("in-place ops on non-leaves are differentiated") {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor y = x * 2.0;
  y.mul_(x);  // y = 2x^2, d/dx = 4x
  y.add_(1.0);
  sum(y).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{4, 8, 12});
}

TEST_CASE("broadcasting is reduced in backward") {
  Tensor a = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor row = leaf({1, 1, 1}, {3});
  Tensor col = leaf({1, 1}, {2, 1});
  Tensor s = leaf({2}, {});
  sum((a + row) * col * s).backward();
  CHECK(row.grad().shape() == Shape{3});
  CHECK(row.grad().to_vector<double>() == std::vector<double>{4, 4, 4});
  CHECK(col.grad().shape() == Shape{2, 1});
  CHECK(col.grad().to_vector<double>() == std::vector<double>{2 * 9, 2 * 18});
  CHECK(s.grad().dim() == 0);
  CHECK(s.grad().item<double>() == 9 + 18);
  CHECK(a.grad().to_vector<double>() == std::vector<double>(6, 2));
}

TEST_CASE("gradients flow back to each input's dtype") {
  Tensor h = from_vector(std::vector<float>{1, 2}, {2}, {.dtype = DType::f16, .requires_grad = true});
  Tensor f = from_vector(std::vector<float>{3, 4}, {2}, {.requires_grad = true});
  Tensor y = sum(h * f);  // f16 * f32 -> f32
  CHECK(y.dtype() == DType::f32);
  y.backward();
  CHECK(h.grad().dtype() == DType::f16);
  CHECK(h.grad().to_vector<float>() == std::vector<float>{3, 4});
  CHECK(f.grad().to_vector<float>() == std::vector<float>{1, 2});
  Tensor d = leaf({1, 2}, {2});
  sum(d.to(DType::f32) * 2).backward();
  CHECK(d.grad().dtype() == DType::f64);
  CHECK(d.grad().to_vector<double>() == std::vector<double>{2, 2});
}

TEST_CASE("nodes record what later passes need and hold no cycles") {
  Tensor x = leaf({1, 2, 3, 4}, {2, 2});
  Tensor y = x * from_vector(std::vector<double>{1, 2});
  auto node = y.grad_fn();
  CHECK(node->name() == "mul");
  CHECK(node->inputs().size() == 2);
  CHECK(node->inputs()[1].shape == Shape{2});
  CHECK(node->outputs()[0].shape == Shape{2, 2});
  CHECK(node->outputs()[0].dtype == DType::f64);
  CHECK_FALSE(node->next_edges()[0].leaf.expired());
  CHECK_FALSE(node->next_edges()[1].requires_grad());
  // The saved output alias does not own the node: dropping y frees the graph.
  std::weak_ptr<Node> weak = node;
  Tensor z = y / 2.0;
  std::weak_ptr<Node> weak_div = z.grad_fn();
  node.reset();
  y = Tensor();
  CHECK_FALSE(weak.expired());  // z's node still needs mul's
  z = Tensor();
  CHECK(weak_div.expired());
  CHECK(weak.expired());
}

TEST_CASE("a long chain is freed without deep recursion") {
  Tensor x = leaf({1}, {1});
  Tensor y = x;
  for (int i = 0; i < 200000; ++i) y = y + 1.0;
  std::weak_ptr<Node> last = y.grad_fn();
  y = Tensor();
  CHECK(last.expired());
}

TEST_CASE("div's divisor gradient is 0 where the dividend is 0, even for a subnormal divisor") {
  // -g a / b^2 with a = 0 is 0; (g / b) * (a / b) would be inf * 0 = NaN once g / b overflows.
  const float tiny = std::numeric_limits<float>::denorm_min();
  Tensor a = from_vector(std::vector<float>{0.0f, 1.0f}, Shape{2}).requires_grad_();
  Tensor b = from_vector(std::vector<float>{tiny, 2.0f}, Shape{2}).requires_grad_();
  div(a, b).backward(from_vector(std::vector<float>{0.5f, 1.0f}, Shape{2}));
  CHECK(b.grad().to_vector<float>() == std::vector<float>{0.0f, -0.25f});
}

TEST_CASE("sum and reshape gradients") {
  Tensor x = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  sum(reshape(x, {3, 2}) * f64({1, 2}, {2}), {0}).backward(f64({1, 10}, {2}));
  CHECK(x.grad().to_vector<double>() == std::vector<double>{1, 20, 1, 20, 1, 20});
}

TEST_CASE("grad-ready hooks run once per backward when a leaf's gradient is complete, last layer first") {
  Tensor a = from_vector<double>({1.0, 2.0}).requires_grad_();
  Tensor b = from_vector<double>({3.0, -1.0}).requires_grad_();
  std::vector<std::string> order;
  std::vector<double> a_seen;
  a.add_grad_ready_hook([&](const Tensor& leaf) {
    order.push_back("a");
    a_seen = leaf.grad().to_vector<double>();  // both of a's paths are in already
  });
  b.add_grad_ready_hook([&](const Tensor&) { order.push_back("b"); });
  // a reaches the loss through two paths; b only after a's first product.
  Tensor h = a * 2.0 + a * 3.0;
  sum(h * b).backward();
  CHECK(order == std::vector<std::string>{"b", "a"});
  CHECK(a_seen == std::vector<double>{15.0, -5.0});  // 5 * b
  order.clear();
  sum(a * b).backward();  // a second backward: each hook once more
  CHECK(order.size() == 2);
  a.clear_grad_ready_hooks();
  order.clear();
  sum(a * b).backward();
  CHECK(order == std::vector<std::string>{"b"});
  CHECK_THROWS_AS(h.add_grad_ready_hook([](const Tensor&) {}), ValueError);
  Tensor plain = from_vector<double>({1.0});
  CHECK_THROWS_AS(plain.add_grad_ready_hook([](const Tensor&) {}), ValueError);
}
