// batch_norm and layer_norm on the CPU, the reference the GPU kernels are tested against:
// the fused ReLU, mixed precision (f16/bf16 x beside f32 parameters, which keep their dtype),
// gradients against f64 finite differences, NaN channels, errors, nn::Sequential's
// BatchNorm2d + ReLU fusion, and the registry cases the consistency suite runs.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "consistency_cases.h"
#include "gradcheck.h"
#include "error_message.h"
#include "kiln/kiln.h"
#include "test_values.h"

using namespace kiln;
using kiln::testing::gradcheck;
using kiln_test::message_of;

namespace {
using kiln_test::max_abs_diff;
using kiln_test::random_f64;

// Per-channel batch statistics of x (N, C, S...) in double: mean and biased variance.
struct ChannelStats {
  std::vector<double> mean, var;
};
ChannelStats channel_stats(const Tensor& x) {
  const std::vector<double> v = x.to_vector<double>();
  const std::int64_t n = x.shape()[0], c = x.shape()[1], s = x.numel() / (n * c);
  ChannelStats st{std::vector<double>(c), std::vector<double>(c)};
  for (std::int64_t ch = 0; ch < c; ++ch) {
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t k = 0; k < s; ++k) st.mean[ch] += v[(i * c + ch) * s + k] / static_cast<double>(n * s);
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t k = 0; k < s; ++k) {
        const double d = v[(i * c + ch) * s + k] - st.mean[ch];
        st.var[ch] += d * d / static_cast<double>(n * s);
      }
  }
  return st;
}

// d(sum(f(inputs) * cot))/d(inputs), on fresh leaves.
std::vector<Tensor> grads_of(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                             const std::vector<Tensor>& inputs, const Tensor& cot) {
  std::vector<Tensor> leaves;
  for (const Tensor& t : inputs) leaves.push_back(t.detach().clone().requires_grad_());
  sum(mul(f(leaves), cot)).backward();
  std::vector<Tensor> g;
  for (const Tensor& t : leaves) g.push_back(t.grad());
  return g;
}

}  // namespace

TEST_CASE("batch_norm with the fused ReLU equals relu(batch_norm), forward and gradients") {
  for (const Shape& s : {Shape{2, 3, 5, 7}, Shape{4, 3}, Shape{1, 3, 5, 7}}) {
    CAPTURE(shape_str(s));
    for (bool training : {true, false}) {
      const Tensor x = random_f64(s, 1), w = random_f64({3}, 2), b = random_f64({3}, 3);
      Tensor rm = random_f64({3}, 4), rv = random_f64({3}, 5, 0.1, 1.0);
      Tensor rm2 = rm.clone(), rv2 = rv.clone();
      Tensor fused = batch_norm(x.detach().requires_grad_(), rm, rv, w, b, training, 0.1, 1e-5, Activation::relu);
      Tensor plain = relu(batch_norm(x, rm2, rv2, w, b, training, 0.1, 1e-5));
      CHECK(fused.grad_fn()->name() == "batch_norm");
      CHECK(max_abs_diff(fused, plain) < 1e-14);
      CHECK(max_abs_diff(rm, rm2) == 0);
      CHECK(max_abs_diff(rv, rv2) == 0);
      const Tensor cot = random_f64(s, 6);
      const Tensor m = rm.clone(), v = rv.clone();  // eval's statistics, unchanged by the calls below
      const auto g1 = grads_of(
          [&](const auto& in) { return batch_norm(in[0], m, v, in[1], in[2], training, 0.1, 1e-5, Activation::relu); },
          {x, w, b}, cot);
      const auto g2 =
          grads_of([&](const auto& in) { return relu(batch_norm(in[0], m, v, in[1], in[2], training, 0.1, 1e-5)); },
                   {x, w, b}, cot);
      for (int i = 0; i < 3; ++i) CHECK(max_abs_diff(g1[i], g2[i]) < 1e-12);
    }
  }
}

TEST_CASE("batch_norm and layer_norm gradients against f64 finite differences") {
  auto ok = [](const testing::GradcheckResult& r) { CHECK_MESSAGE(r.ok, r.message); };
  const Tensor x4 = random_f64({2, 3, 5, 7}, 11, 2.0), x2 = random_f64({5, 3}, 12), x1 = random_f64({1, 3, 5, 7}, 13);
  const Tensor w = random_f64({3}, 14), b = random_f64({3}, 15);
  for (const Tensor& x : {x4, x2, x1}) {
    CAPTURE(shape_str(x.shape()));
    ok(gradcheck([](const auto& v) { return batch_norm(v[0], {}, {}, v[1], v[2], true, 0.1, 1e-5, Activation::relu); },
                 {x, w, b}));
    ok(gradcheck([](const auto& v) { return batch_norm(v[0], {}, {}, v[1], {}, true); }, {x, w}));
    ok(gradcheck([](const auto& v) { return batch_norm(v[0], {}, {}, {}, v[1], true); }, {x, b}));
    // Eval: the gradient reaches the running statistics too.
    ok(gradcheck(
        [](const auto& v) { return batch_norm(v[0], v[1], v[2], v[3], {}, false, 0.1, 1e-5, Activation::relu); },
        {x, random_f64({3}, 16), random_f64({3}, 17, 0.1, 1.5), w}));
  }
  ok(gradcheck([](const auto& v) { return layer_norm(v[0], {5, 7}, v[1], {}); }, {x4, random_f64({5, 7}, 18)}));
  ok(gradcheck([](const auto& v) { return layer_norm(v[0], {3}, {}, v[1]); }, {x2, random_f64({3}, 19)}));
  ok(gradcheck([](const auto& v) { return layer_norm(v[0], {7}, v[1], v[2]); },
               {x1, random_f64({7}, 20), random_f64({7}, 21)}));
}

TEST_CASE("mixed precision: bf16/f16 x with f32 parameters and running statistics, which keep their dtype") {
  for (DType t : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(t));
    const Tensor x = random_f64({4, 3, 5, 7}, 30, 1.5, 0.5).to(t);
    const Tensor x64 = x.to(DType::f64);  // the values the op sees
    Tensor w = random_f64({3}, 31).to(DType::f32).requires_grad_(),
           b = random_f64({3}, 32).to(DType::f32).requires_grad_();
    Tensor rm = zeros({3}), rv = ones({3});
    const void* rm_storage = rm.data_ptr();
    Tensor y = batch_norm(x, rm, rv, w, b, true, 0.25);
    CHECK(y.dtype() == t);
    // The running statistics are updated in place, in f32, from statistics computed in f32.
    CHECK(rm.dtype() == DType::f32);
    CHECK(rm.data_ptr() == rm_storage);
    const ChannelStats st = channel_stats(x64);
    const std::vector<double> got_rm = rm.to_vector<double>(), got_rv = rv.to_vector<double>();
    for (int c = 0; c < 3; ++c) {
      CHECK(got_rm[c] == doctest::Approx(0.25 * st.mean[c]).epsilon(1e-6));
      CHECK(got_rv[c] == doctest::Approx(0.75 + 0.25 * st.var[c] * 140 / 139).epsilon(1e-6));
    }
    const Tensor want = batch_norm(x64, Tensor(), Tensor(), w.detach().to(DType::f64), b.detach().to(DType::f64), true);
    CHECK(max_abs_diff(y, want) < (t == DType::bf16 ? 0.04 : 0.005));
    // The parameters' gradients come back in their dtype.
    sum(y).backward();
    CHECK(w.grad().dtype() == DType::f32);
    CHECK(b.grad().dtype() == DType::f32);
    CHECK(b.grad().to_vector<double>()[0] == doctest::Approx(140));
    // Eval from f32 running statistics, and layer_norm with f32 weight and bias.
    CHECK(batch_norm(x, rm, rv, w, b, false).dtype() == t);
    Tensor lw = random_f64({7}, 33).to(DType::f32).requires_grad_();
    Tensor ly = layer_norm(x, {7}, lw, zeros({7}));
    CHECK(ly.dtype() == t);
    CHECK(max_abs_diff(ly, layer_norm(x64, {7}, lw.detach().to(DType::f64))) < (t == DType::bf16 ? 0.04 : 0.005));
    sum(ly).backward();
    CHECK(lw.grad().dtype() == DType::f32);
  }
  // f64 x with f32 parameters computes in f64; the f32 running statistics are still updated.
  const Tensor x = random_f64({6, 2}, 40);
  Tensor rm = zeros({2}), rv = ones({2});
  Tensor y = batch_norm(x, rm, rv, ones({2}), zeros({2}), true, 1.0);
  CHECK(y.dtype() == DType::f64);
  CHECK(rm.dtype() == DType::f32);
  const ChannelStats st = channel_stats(x);
  CHECK(rm.to_vector<double>()[1] == doctest::Approx(st.mean[1]).epsilon(1e-6));
  CHECK(rv.to_vector<double>()[1] == doctest::Approx(st.var[1] * 6 / 5).epsilon(1e-6));
}

TEST_CASE("the dtype plan keeps f32 parameters beside bf16 x and casts mismatched ones") {
  const OpDef& op = get_op("batch_norm");
  const Tensor x = ones({2, 3}, {.dtype = DType::bf16}), p = ones({3});
  const Attrs attrs{{"training", false}};
  std::vector<Tensor> out = dispatch(op, std::vector<Tensor>{x, p, p, p, p, x}, attrs);
  CHECK(out[0].dtype() == DType::bf16);
  CHECK(out[1].dtype() == DType::f32);
  // bf16 parameters stay bf16; f64 ones beside bf16 x compute in f32.
  out = dispatch(op, std::vector<Tensor>{x, p.to(DType::bf16), p.to(DType::bf16), p, p, x}, attrs);
  CHECK(out[0].dtype() == DType::bf16);
  CHECK_THROWS_AS(dispatch(op, std::vector<Tensor>{x, p.to(DType::i64), p, p, p, x}, attrs), DTypeError);
}

TEST_CASE("a channel holding NaN or Inf gets NaN statistics; the other channels are unaffected") {
  for (double bad : {std::nan(""), std::numeric_limits<double>::infinity()}) {
    std::vector<double> v = random_f64({4, 2, 3}, 50).to_vector<double>();
    v[1] = bad;  // channel 0
    const Tensor x = from_vector(v, {4, 2, 3}, {.dtype = DType::f64});
    Tensor rm = zeros({2}, {.dtype = DType::f64}), rv = ones({2}, {.dtype = DType::f64});
    const std::vector<double> y = batch_norm(x, rm, rv, {}, {}, true).to_vector<double>();
    CHECK(std::isnan(rm.to_vector<double>()[0]));
    CHECK(std::isnan(rv.to_vector<double>()[0]));
    CHECK(std::isfinite(rm.to_vector<double>()[1]));
    for (int n = 0; n < 4; ++n)
      for (int k = 0; k < 3; ++k) {
        CHECK(std::isnan(y[(n * 2 + 0) * 3 + k]));
        CHECK(std::isfinite(y[(n * 2 + 1) * 3 + k]));
      }
    const std::vector<double> ly = layer_norm(x, {3}).to_vector<double>();
    CHECK(std::isnan(ly[0]));
    CHECK(std::isfinite(ly[3]));
  }
}

TEST_CASE("batch_norm and layer_norm errors name the op") {
  const Tensor x = ones({4, 3, 2, 2});
  CHECK(message_of<ShapeError>([&] { batch_norm(x, {}, {}, ones({4}), {}, true); }) ==
        "[batch_norm] weight has shape (4,); expected (3,)");
  CHECK(message_of<ShapeError>([&] {
          batch_norm(x, ones({3, 1}), ones({3}), {}, {}, false);
        }) == "[batch_norm] running_mean has shape (3,1); expected (3,)");
  CHECK(message_of<ValueError>([&] { batch_norm(x, {}, {}, {}, {}, false); }) ==
        "[batch_norm] eval mode needs running_mean and running_var");
  CHECK(message_of<ValueError>([&] {
          batch_norm(ones({1, 3}), {}, {}, {}, {}, true);
        }) == "[batch_norm] training needs more than one value per channel; got input (1,3)");
  CHECK(message_of<ShapeError>([&] { batch_norm(ones({3}), {}, {}, {}, {}, true); }) ==
        "[batch_norm] input must be (N, C) or (N, C, d...); got (3,)");
  CHECK(message_of<DTypeError>([&] {
          batch_norm(ones({4, 3}, {.dtype = DType::i64}), {}, {}, {}, {}, true);
        }).starts_with("[batch_norm] input must be floating"));
  CHECK(message_of<ShapeError>([&] { layer_norm(x, {2}, ones({3})); }) ==
        "[layer_norm] weight has shape (3,); expected (2,)");
  CHECK(message_of<ShapeError>([&] { layer_norm(x, {3}); }).starts_with("[layer_norm] normalized_shape (3,)"));
}

TEST_CASE("batch_norm and batch_norm_max_pool2d add one to num_batches_tracked in training, none in eval") {
  Generator gen(61);
  const Tensor x = randn({4, 3, 4, 6}, {}, &gen);
  Tensor count = scalar_tensor(std::int64_t{5}), rm = zeros({3}), rv = ones({3});
  const std::uint64_t v0 = count.version();
  batch_norm(x, rm, rv, {}, {}, true, 0.1, 1e-5, Activation::none, count);
  CHECK(count.item<std::int64_t>() == 6);
  CHECK(count.version() > v0);  // in place, as running_mean
  batch_norm_max_pool2d(x, rm, rv, {}, {}, true, 0.1, 1e-5, Activation::relu, {2}, count);
  CHECK(count.item<std::int64_t>() == 7);
  batch_norm(x, rm, rv, {}, {}, false, 0.1, 1e-5, Activation::none, count);
  batch_norm_max_pool2d(x, rm, rv, {}, {}, false, 0.1, 1e-5, Activation::none, {2}, count);
  CHECK(count.item<std::int64_t>() == 7);
  // The CPU's fast path (f64) and the one through f32 (bf16) count too; without channels as well.
  batch_norm(x.to(DType::f64), {}, {}, {}, {}, true, 0.1, 1e-5, Activation::none, count);
  batch_norm(x.to(DType::bf16), {}, {}, {}, {}, true, 0.1, 1e-5, Activation::none, count);
  batch_norm(zeros({4, 0, 3}), {}, {}, {}, {}, true, 0.1, 1e-5, Activation::none, count);
  CHECK(count.item<std::int64_t>() == 10);
  // The counter takes no part in the gradients.
  const Tensor xg = x.detach().requires_grad_();
  sum(batch_norm(xg, {}, {}, {}, {}, true, 0.1, 1e-5, Activation::none, count)).backward();
  CHECK(xg.grad().defined());
  CHECK(count.item<std::int64_t>() == 11);
  CHECK(message_of<DTypeError>([&] {
          batch_norm(x, {}, {}, {}, {}, true, 0.1, 1e-5, Activation::none, scalar_tensor(1.0));
        }) == "[batch_norm] num_batches_tracked must be one i64 element; got f32 of shape ()");
  CHECK(message_of<DTypeError>([&] {
          batch_norm_max_pool2d(x, {}, {}, {}, {}, true, 0.1, 1e-5, Activation::none, {2},
                                zeros({2}, {.dtype = DType::i64}));
        }) == "[batch_norm_max_pool2d] num_batches_tracked must be one i64 element; got i64 of shape (2,)");
}

TEST_CASE("nn::Sequential runs BatchNorm2d then ReLU as one fused batch_norm") {
  Generator gen(60);
  const Tensor x = randn({4, 3, 5, 7}, {}, &gen);
  nn::Sequential fused(nn::BatchNorm2d(3), nn::ReLU());
  nn::BatchNorm2d alone(3);
  const Tensor y = fused(x.detach().requires_grad_());
  CHECK(y.grad_fn()->name() == "batch_norm");
  CHECK(max_abs_diff(y, relu(alone(x))) == 0);
  CHECK(max_abs_diff(fused.named_buffers()[0].second, alone.named_buffers()[0].second) == 0);  // running_mean
  CHECK(fused.named_buffers()[2].second.item<std::int64_t>() == 1);                            // num_batches_tracked
  fused.eval();
  alone.eval();
  CHECK(max_abs_diff(fused(x), relu(alone(x))) == 0);
}

TEST_CASE("the consistency suite runs batch_norm and layer_norm in every dtype, 2-D and 4-D, fused or not") {
  for (const char* name : {"batch_norm", "batch_norm_backward", "layer_norm", "layer_norm_backward"}) {
    CAPTURE(name);
    const OpDef& op = get_op(name);
    REQUIRE(op.gpu);
    std::set<std::string> accepted;  // dtype, rank, relu, has_weight
    for (const consistency::Case& c : consistency::make_cases(op)) {
      if (c.special) continue;
      Generator gen(1);
      std::vector<Tensor> in;
      for (std::size_t i = 0; i < c.inputs.size(); ++i)
        in.push_back(
            consistency::make_input(c.inputs[i], c.dtype, op.test, false, static_cast<int>(i), gen, Device::cpu()).cpu);
      try {
        (void)dispatch(op, in, c.attrs);
      } catch (const Error&) {
        continue;
      }
      const std::size_t x = std::string(name).ends_with("backward") ? 1 : 0;
      accepted.insert(std::string(dtype_name(c.dtype)) + " rank=" + std::to_string(in[x].dim()) +
                      " relu=" + (c.attrs.get_or<bool>("relu", false) ? "1" : "0") +
                      " weight=" + (c.attrs.get_or<bool>("has_weight", true) ? "1" : "0"));
    }
    const bool batch = std::string(name).starts_with("batch");
    for (const std::string dt : {"f32", "f64", "f16", "bf16"})
      for (const std::string weight : {"0", "1"})
        for (const std::string rank : {"2", batch ? "4" : "3"})
          for (const std::string relu : {"0", batch ? "1" : "0"})
            CHECK_MESSAGE(accepted.count(dt + " rank=" + rank + " relu=" + relu + " weight=" + weight), dt,
                          " rank=", rank, " relu=", relu, " weight=", weight);
  }
}

TEST_CASE("batch_norm and layer_norm on empty inputs") {
  // Eval of a batch without values: an empty result (the spatial size 0 must not divide).
  const Tensor rm = zeros({3}), rv = ones({3});
  CHECK(batch_norm(zeros({4, 3, 0}), rm, rv).shape() == Shape{4, 3, 0});
  CHECK(batch_norm(zeros({0, 3, 2}), rm, rv).shape() == Shape{0, 3, 2});
  CHECK_THROWS_AS(batch_norm(zeros({4, 3, 0}), {}, {}, {}, {}, true), ValueError);
  Tensor x = zeros({0, 5}).requires_grad_();
  Tensor w = ones({5}).requires_grad_();
  Tensor y = layer_norm(x, {5}, w);
  CHECK(y.shape() == Shape{0, 5});
  sum(y).backward();
  CHECK(w.grad().to_vector<float>() == std::vector<float>(5, 0.0f));
}
