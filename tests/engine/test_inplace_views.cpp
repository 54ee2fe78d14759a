// In-place writes through views: the base's history records them (values and gradients
// as PyTorch gives), views taken earlier follow, and what autograd cannot follow throws.
#include <doctest/doctest.h>

#include "error_message.h"
#include "gradcheck.h"
#include "kiln/kiln.h"
#include "test_values.h"

using namespace kiln;
using kiln::testing::gradcheck;
using kiln_test::message_of;

namespace {
using kiln_test::leaf;
using V = std::vector<double>;
}  // namespace

TEST_CASE("add_ on a slice sends gradients to the added tensor and the base") {
  // PyTorch: t = x.clone(); t[0:1].add_(y); (t * t).sum().backward() -> y.grad [22, 44].
  Tensor x = leaf({1, 2, 3, 4}, {2, 2});
  Tensor y = leaf({10, 20}, {2});
  Tensor t = x.clone();
  slice(t, 0, 0, 1).add_(y);
  CHECK(t.to_vector<double>() == V{11, 22, 3, 4});
  sum(t * t).backward();
  REQUIRE(y.grad().defined());
  CHECK(y.grad().to_vector<double>() == V{22, 44});
  CHECK(x.grad().to_vector<double>() == V{22, 44, 6, 8});  // t[0] = x[0] + y still depends on x[0]
}

TEST_CASE("in-place ops through views match finite differences") {
  Tensor a = from_vector<double>({0.5, -1.2, 2.0, 0.3, 1.1, -0.7}, {2, 3});
  Tensor b = from_vector<double>({1.5, 0.8}, {2});
  // mul_ saves the view's old values; the view is a column of a transposed base.
  auto r = gradcheck(
      [](const std::vector<Tensor>& x) {
        Tensor t = x[0] * 1.0;
        Tensor col = slice(transpose(t, 0, 1), 0, 1, 2);  // (1, 2), strides (1, 3)
        col.mul_(x[1]);
        slice(t, 1, 0, 1).sub_(2.0);
        return sum(t * t * t);
      },
      {a, b});
  CHECK_MESSAGE(r.ok, r.message);
  auto r2 = gradcheck(
      [](const std::vector<Tensor>& x) {
        Tensor t = x[0] * 2.0;
        slice(t, 1, 1, 3).copy_(x[1].reshape({2, 1}));  // broadcast into a (2, 2) view
        return sum(exp(t));
      },
      {a, b});
  CHECK_MESSAGE(r2.ok, r2.message);
}

TEST_CASE("fill_ and zero_ on a view cut that region's gradient") {
  Tensor x = leaf({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor t = x * 1.0;
  slice(t, 0, 1, 2).fill_(7.0);
  slice(t, 0, 2, 3).zero_();
  CHECK(t.to_vector<double>() == V{1, 2, 7, 7, 0, 0});
  sum(t * t).backward();
  CHECK(x.grad().to_vector<double>() == V{2, 4, 0, 0, 0, 0});
}

TEST_CASE("a view taken before an in-place write through another view sees the write") {
  Tensor x = leaf({1, 2, 3, 4}, {2, 2});
  Tensor y = leaf({10, 20}, {2});
  Tensor t = x * 1.0;
  Tensor first_row = slice(t, 0, 0, 1);
  Tensor other = slice(t, 0, 0, 1);
  other.add_(y);
  CHECK(first_row.to_vector<double>() == V{11, 22});
  sum(first_row * first_row).backward();
  CHECK(y.grad().to_vector<double>() == V{22, 44});
  CHECK(x.grad().to_vector<double>() == V{22, 44, 0, 0});
}

TEST_CASE("a base without history takes one from a write of a tensor that requires grad") {
  Tensor y = leaf({1, 2, 3}, {3});
  Tensor t = zeros({2, 3}, {.dtype = DType::f64});
  slice(t, 0, 1, 2).add_(y);
  CHECK(t.requires_grad());
  sum(t * t).backward();
  CHECK(y.grad().to_vector<double>() == V{2, 4, 6});
}

TEST_CASE("an in-place write directly into a base updates views taken before it") {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = leaf({3, 4}, {2});
  Tensor t = x * 1.0;
  Tensor v = slice(t, 0, 1, 2);
  t.mul_(y);
  sum(v * 1.0).backward();
  CHECK(y.grad().to_vector<double>() == V{0, 2});
  CHECK(x.grad().to_vector<double>() == V{0, 4});
}

TEST_CASE("in-place writes autograd cannot follow throw, naming the op") {
  Tensor x = leaf({1, 2, 3, 4}, {2, 2});
  Tensor y = leaf({1, 1}, {2});
  std::string m = message_of<ValueError>([&] { slice(x, 0, 0, 1).add_(y); });
  CHECK(m.find("[add_]") == 0);
  CHECK(m.find("view of a leaf") != std::string::npos);
  m = message_of<ValueError>([&] { slice(x, 0, 0, 1).fill_(0); });
  CHECK(m.find("[fill_]") == 0);

  Tensor row = sum(x, {0}, true) * 1.0;  // (1, 2), not a leaf
  Tensor wide = expand(row, {3, 2});    // every row is the same memory
  m = message_of<ValueError>([&] { wide.mul_(2.0); });
  CHECK(m.find("[mul_]") == 0);
  CHECK(m.find("share memory") != std::string::npos);

  // Without grad mode nothing is recorded and nothing is refused.
  NoGradGuard no_grad;
  Tensor d = x.detach() * 1.0;
  slice(d, 0, 0, 1).add_(1.0);
  CHECK(d.to_vector<double>() == V{2, 3, 3, 4});
}
