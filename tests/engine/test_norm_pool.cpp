// batch_norm_max_pool2d on the CPU (its reference, which the GPU kernels are tested against):
// the same values, running statistics and gradients as batch_norm then max_pool2d, windows that
// leave rows and columns unpooled, errors, and nn::Sequential keeping the separate ops on the CPU.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "bn_pool_run.h"
#include "error_message.h"
#include "kiln/kiln.h"
#include "test_values.h"

using namespace kiln;
using kiln_test::max_abs_diff;
using kiln_test::message_of;
using kiln_test::PoolRun;
using kiln_test::random_f64;
using kiln_test::run_bn_pool;

namespace {

using Dims = std::vector<std::int64_t>;

}  // namespace

TEST_CASE("batch_norm_max_pool2d equals max_pool2d(batch_norm(x)): values, running statistics, gradients") {
  for (DType t : {DType::f64, DType::f32})
    for (const Shape& s : {Shape{3, 2, 6, 8}, Shape{2, 3, 5, 7}})
      for (const Dims& k : {Dims{2}, Dims{3, 2}})
        for (bool training : {true, false})
          for (Activation act : {Activation::none, Activation::relu}) {
            const std::string name = std::string(dtype_name(t)) + " " + shape_str(s) + " k=" + std::to_string(k[0]) +
                                     (training ? " train" : " eval") + (act == Activation::relu ? " relu" : "");
            CAPTURE(name);
            const Tensor x = random_f64(s, 1, 2.0, 0.3).to(t), w = random_f64({s[1]}, 2).to(t);
            const Tensor b = random_f64({s[1]}, 3).to(t);
            const Shape pooled{s[0], s[1], s[2] / k[0], s[3] / k.back()};
            const Tensor cot = random_f64(pooled, 4).to(t);
            const PoolRun fused = run_bn_pool(true, x, w, b, training, act, k, cot, x.dtype()),
                          plain = run_bn_pool(false, x, w, b, training, act, k, cot, x.dtype());
            REQUIRE(fused.y.shape() == pooled);
            const double tol = t == DType::f64 ? 1e-12 : 1e-5;
            CHECK(max_abs_diff(fused.y, plain.y) <= tol);
            CHECK(max_abs_diff(fused.running_mean, plain.running_mean) <= tol);
            CHECK(max_abs_diff(fused.running_var, plain.running_var) <= tol);
            for (std::size_t i = 0; i < 3; ++i) {
              CAPTURE(i);
              REQUIRE(fused.grads[i].defined());
              CHECK(max_abs_diff(fused.grads[i], plain.grads[i]) <= 20 * tol);
            }
          }
}

TEST_CASE("batch_norm_max_pool2d: the rows and columns past the last window get only the statistics' gradient") {
  // 5 x 7 with 2 x 2 windows: row 4 and column 6 are in no window; their dx comes from the
  // mean and variance alone, as in the unfused ops.
  const Tensor x = random_f64({2, 1, 5, 7}, 11).requires_grad_();
  const Tensor y = batch_norm_max_pool2d(x, {}, {}, {}, {}, true, 0.1, 1e-5, Activation::none, {2});
  sum(y).backward();
  const Tensor x2 = x.detach().clone().requires_grad_();
  sum(max_pool2d(batch_norm(x2, {}, {}, {}, {}, true), {2})).backward();
  CHECK(max_abs_diff(x.grad(), x2.grad()) <= 1e-12);
  CHECK(x.grad().to_vector<double>()[4 * 7 + 6] != 0.0);
}

TEST_CASE("batch_norm_max_pool2d errors name the op") {
  const Tensor x = ones({2, 3, 4, 4}), c3 = ones({3});
  CHECK(message_of<ShapeError>([&] {
          batch_norm_max_pool2d(ones({2, 3, 4}), {}, {}, {}, {}, true, 0.1, 1e-5, Activation::none, {2});
        }) == "[batch_norm_max_pool2d] input must be (N, C, H, W); got (2,3,4)");
  CHECK(message_of<ShapeError>([&] {
          batch_norm_max_pool2d(x, {}, {}, {}, {}, true, 0.1, 1e-5, Activation::none, {5});
        }) == "[batch_norm_max_pool2d] kernel (5, 5) must be positive and fit the input (2,3,4,4)");
  CHECK(message_of<ValueError>([&] {
          batch_norm_max_pool2d(x, {}, {}, {}, {}, true, 0.1, 1e-5, Activation::none, {});
        }) == "[batch_norm_max_pool2d] kernel must have one or two values");
  CHECK(message_of<ShapeError>([&] {
          batch_norm_max_pool2d(x, {}, {}, ones({4}), {}, true, 0.1, 1e-5, Activation::none, {2});
        }) == "[batch_norm_max_pool2d] weight has shape (4,); expected (3,)");
  CHECK(message_of<ValueError>([&] {
          batch_norm_max_pool2d(x, {}, {}, c3, c3, false, 0.1, 1e-5, Activation::none, {2});
        }) == "[batch_norm_max_pool2d] eval mode needs running_mean and running_var");
}

TEST_CASE("nn::Sequential keeps BatchNorm2d, ReLU and MaxPool2d as their own ops on the CPU") {
  Generator gen(60);
  nn::Sequential net(nn::BatchNorm2d(3), nn::ReLU(), nn::MaxPool2d({2}));
  const Tensor y = net(randn({4, 3, 6, 6}, {}, &gen).requires_grad_());
  CHECK(y.grad_fn()->name() == "max_pool2d");
  CHECK(nn::MaxPool2d({2}).tiling_kernel() == Dims{2, 2});
  CHECK(nn::MaxPool2d({3}, {2}).tiling_kernel().empty());
  CHECK(nn::MaxPool2d({2}, {2}, {1}).tiling_kernel().empty());
}
