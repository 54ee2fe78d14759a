// Which autograd nodes a conv's input gradient may park pooled batch-norm sums for
// (engine/ops/bn_pool_sums.h), without a GPU: a batch_norm_max_pool2d in training with 2 x 2
// windows, its saved tensors named; nothing for eval, other windows or other ops; no parked sums
// wanted outside a conv's vjp or for a CPU gradient. The GPU tests check the sums themselves.
#include <doctest/doctest.h>

#include "kiln/kiln.h"
#include "ops/bn_pool_sums.h"

using namespace kiln;

namespace {

Tensor pooled(const Tensor& x, const Tensor& w, const Tensor& b, bool training, std::vector<std::int64_t> k) {
  const Tensor rm = zeros({x.shape()[1]}), rv = ones({x.shape()[1]});
  return batch_norm_max_pool2d(x, rm, rv, w, b, training, 0.1, 1e-5, Activation::relu, std::move(k));
}

}  // namespace

TEST_CASE("pooled batch-norm sums: the consumer is a pooled batch norm in training with 2 x 2 windows") {
  Generator gen(5);
  const Tensor x = randn({2, 3, 8, 8}, {}, &gen).requires_grad_();
  const Tensor w = ones({3}).requires_grad_(), b = zeros({3}).requires_grad_();
  const Tensor y = pooled(x, w, b, true, {2});
  const auto c = bn_pool_sums::consumer_of(y.grad_fn().get());
  REQUIRE(c.has_value());
  CHECK(c->x.data_ptr() == x.data_ptr());
  CHECK(c->weight.data_ptr() == w.data_ptr());
  CHECK(c->bias.data_ptr() == b.data_ptr());
  CHECK(c->mean.shape() == Shape{3});
  CHECK(c->invstd.shape() == Shape{3});
  CHECK(c->relu);
  // Without parameters they stay undefined.
  const auto bare = bn_pool_sums::consumer_of(pooled(x, {}, {}, true, {2, 2}).grad_fn().get());
  REQUIRE(bare.has_value());
  CHECK_FALSE(bare->weight.defined());
  CHECK_FALSE(bare->bias.defined());
}

TEST_CASE("pooled batch-norm sums: none for eval, other windows, other ops or no node") {
  Generator gen(6);
  const Tensor x = randn({2, 3, 12, 12}, {}, &gen).requires_grad_();
  CHECK_FALSE(bn_pool_sums::consumer_of(pooled(x, {}, {}, false, {2}).grad_fn().get()).has_value());
  CHECK_FALSE(bn_pool_sums::consumer_of(pooled(x, {}, {}, true, {3}).grad_fn().get()).has_value());
  CHECK_FALSE(bn_pool_sums::consumer_of(pooled(x, {}, {}, true, {2, 3}).grad_fn().get()).has_value());
  CHECK_FALSE(bn_pool_sums::consumer_of(relu(x).grad_fn().get()).has_value());
  CHECK_FALSE(bn_pool_sums::consumer_of(nullptr).has_value());
}

TEST_CASE("pooled batch-norm sums: wanted only under a conv's vjp, for a GPU gradient of the pooled shape") {
  Generator gen(7);
  const Tensor x = randn({2, 3, 8, 8}, {}, &gen).requires_grad_();
  const auto c = bn_pool_sums::consumer_of(pooled(x, {}, {}, true, {2}).grad_fn().get());
  REQUIRE(c.has_value());
  const Tensor g = zeros({2, 3, 4, 4});
  CHECK(bn_pool_sums::wanted(g) == nullptr);
  const bn_pool_sums::ForGradient scope(*c);
  CHECK(bn_pool_sums::wanted(g) == nullptr);  // the kernels that park them run on the GPU
  CHECK(bn_pool_sums::wanted(zeros({2, 3, 8, 8})) == nullptr);
  bn_pool_sums::keep(g, zeros({6, 1}));  // not wanted: nothing kept
  CHECK_FALSE(bn_pool_sums::take(g, *c).defined());
}
