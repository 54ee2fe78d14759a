// NN functions on the GPU against the CPU reference: softmax/log_softmax (warp and block
// rows, permuted and strided inputs), nll_loss, cross_entropy, layer_norm and batch_norm,
// forward and backward in f32/f16/bf16 (and f64 gradient checks), and dropout masks that
// match the CPU bit for bit for one seed.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "gpu_match.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

using kiln_test::kGpu;

double softmax_tolerance(DType t) {
  switch (t) {
    case DType::f16:
      return 1e-2;
    case DType::bf16:
      return 4e-2;
    case DType::f64:
      return 1e-12;
    default:
      return 2e-5;
  }
}

using kiln_test::check_match;

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// Runs f on copies of `inputs` (in dtype t) on each device, then backward with one random
// cotangent; compares the outputs and the floating inputs' gradients.
void check_softmax_both(const Fn& f, const std::vector<Tensor>& inputs, DType t, const std::string& name) {
  std::vector<Tensor> cpu_in, gpu_in;
  for (const Tensor& x : inputs) {
    Tensor c = is_floating(x.dtype()) ? x.to(t) : x;
    Tensor g = c.to(kGpu);
    if (is_floating(x.dtype())) {
      c.requires_grad_();
      g.requires_grad_();
    }
    cpu_in.push_back(c);
    gpu_in.push_back(g);
  }
  Tensor yc = f(cpu_in), yg = f(gpu_in);
  const double tol = softmax_tolerance(t);
  check_match(yc, yg, tol, name + " forward");
  Generator gen(3);
  Tensor cot = randn(yc.shape(), {.dtype = yc.dtype()}, &gen);
  yc.backward(cot);
  yg.backward(cot.to(kGpu));
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (is_floating(inputs[i].dtype()))
      check_match(cpu_in[i].grad(), gpu_in[i].grad(), 4 * tol, name + " grad of input " + std::to_string(i));
}

Tensor softmax_normal(const Shape& s, std::uint64_t seed, double scale = 1.0) {
  Generator g(seed);
  return mul(randn(s, {.dtype = DType::f64}, &g), scale);
}

const DType kSoftmaxDTypes[] = {DType::f32, DType::f16, DType::bf16};

}  // namespace

TEST_CASE("softmax and log_softmax on the GPU match the CPU: warp rows, block rows, permuted and strided") {
  struct Case {
    Shape shape;
    std::int64_t dim;
  };
  const Case cases[] = {{{7, 33}, -1}, {{5, 3000}, 1}, {{4, 6, 5}, 1}, {{300, 3}, 0}, {{1}, 0}, {{2, 1025}, -1}};
  for (DType t : kSoftmaxDTypes) {
    for (const Case& c : cases) {
      const std::string shape =
          std::string(dtype_name(t)) + ", shape=" + shape_str(c.shape) + ", dim=" + std::to_string(c.dim);
      Tensor x = softmax_normal(c.shape, 1, 3.0);
      check_softmax_both([&](const auto& v) { return softmax(v[0], c.dim); }, {x}, t, "softmax(" + shape + ")");
      check_softmax_both([&](const auto& v) { return log_softmax(v[0], c.dim); }, {x}, t, "log_softmax(" + shape + ")");
    }
    // A transposed view takes the strided path.
    Tensor x = softmax_normal({9, 40}, 2).to(t);
    Tensor xt = make_view(x, {40, 9}, {1, 40}, 0), xtg = make_view(x.to(kGpu), {40, 9}, {1, 40}, 0);
    check_match(softmax(xt, 1), softmax(xtg, 1), softmax_tolerance(t), "softmax of a transposed view");
  }
  Tensor big = from_vector(std::vector<float>{1e4f, 1e4f + 1, -1e4f, 3}, {2, 2});
  check_match(log_softmax(big, 1), log_softmax(big.to(kGpu), 1), 1e-6, "log_softmax of 1e4");
}

TEST_CASE("nll_loss and cross_entropy on the GPU match the CPU, forward and backward") {
  Tensor labels = from_vector(std::vector<std::int64_t>{3, 0, 9, 9, 1, 2}, {6});
  Tensor ignored = from_vector(std::vector<std::int64_t>{3, -100, 9, 9, -100, 2}, {6});
  Tensor labels3 = from_vector(std::vector<std::int64_t>{0, 1, 2, 2, 1, 0, 0, 0}, {2, 4});
  for (DType t : kSoftmaxDTypes) {
    const std::string dt(dtype_name(t));
    Tensor x = softmax_normal({6, 10}, 4, 2.0), x3 = softmax_normal({2, 3, 4}, 5);
    for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none}) {
      check_softmax_both([&](const auto& v) { return cross_entropy(v[0], v[1], r); }, {x, labels}, t, "cross_entropy " + dt);
      check_softmax_both([&](const auto& v) { return cross_entropy(v[0], v[1], r, 0.1, -100); }, {x, ignored}, t,
                 "cross_entropy smoothed, ignore " + dt);
      check_softmax_both([&](const auto& v) { return cross_entropy(v[0], v[1], r, 0.2); }, {x3, labels3}, t,
                 "cross_entropy (N,C,d) " + dt);
      check_softmax_both([&](const auto& v) { return nll_loss(v[0], v[1], r, -100); }, {x, ignored}, t, "nll_loss " + dt);
    }
  }
  // Strided log-probabilities (a transposed view) are gathered through a contiguous copy.
  Tensor base = softmax_normal({5, 6}, 21).to(DType::f32);
  Tensor lpt = make_view(base, {6, 5}, {1, 6}, 0), lptg = make_view(base.to(kGpu), {6, 5}, {1, 6}, 0);
  Tensor lab = from_vector(std::vector<std::int64_t>{4, 0, 1, 2, 3, 4}, {6});
  check_match(nll_loss(lpt, lab, Reduction::none), nll_loss(lptg, lab.to(kGpu), Reduction::none), 0,
              "nll_loss of a transposed view");
  // Out-of-range labels: documented NaN on the GPU (the CPU throws).
  Tensor lp = zeros({2, 3}, {.device = kGpu});
  Tensor bad = from_vector(std::vector<std::int64_t>{1, 7}, {2}).to(kGpu);
  std::vector<float> l = nll_loss(lp, bad, Reduction::none).to_vector<float>();
  CHECK(l[0] == 0);
  CHECK(std::isnan(l[1]));
}

TEST_CASE("layer_norm and batch_norm on the GPU match the CPU, forward, backward and running stats") {
  for (DType t : kSoftmaxDTypes) {
    const std::string dt(dtype_name(t));
    Tensor x = softmax_normal({4, 3, 5}, 6, 2.0), w = softmax_normal({3, 5}, 7), b = softmax_normal({3, 5}, 8);
    check_softmax_both([](const auto& v) { return layer_norm(v[0], {3, 5}, v[1], v[2]); }, {x, w, b}, t, "layer_norm " + dt);
    check_softmax_both([](const auto& v) { return layer_norm(v[0], {5}); }, {x}, t, "layer_norm no affine " + dt);
    Tensor x4 = softmax_normal({4, 3, 5, 6}, 9, 2.0), cw = softmax_normal({3}, 10), cb = softmax_normal({3}, 11);
    check_softmax_both([](const auto& v) { return batch_norm(v[0], {}, {}, v[1], v[2], true); }, {x4, cw, cb}, t,
               "batch_norm train " + dt);
    check_softmax_both([](const auto& v) { return batch_norm(v[0], {}, {}, {}, {}, true); }, {softmax_normal({8, 3}, 12)}, t,
               "batch_norm (N,C) " + dt);
    Tensor rm = softmax_normal({3}, 13).to(t), rv = add(mul(softmax_normal({3}, 14), softmax_normal({3}, 14)), 0.5).to(t);
    Tensor rmg = rm.to(kGpu), rvg = rv.to(kGpu);
    check_softmax_both([&](const auto& v) { return batch_norm(v[0], rm.to(v[0].device()), rv.to(v[0].device()), v[1], v[2]); },
               {x4, cw, cb}, t, "batch_norm eval " + dt);
    Tensor xc = x4.to(t);
    batch_norm(xc, rm, rv, {}, {}, true, 0.2);
    batch_norm(xc.to(kGpu), rmg, rvg, {}, {}, true, 0.2);
    check_match(rm, rmg, softmax_tolerance(t), "running_mean " + dt);
    check_match(rv, rvg, softmax_tolerance(t), "running_var " + dt);
  }
}

TEST_CASE("gradient checks in f64 on the GPU") {
  Tensor x = softmax_normal({4, 7}, 20, 2.0).to(kGpu);
  Tensor labels = from_vector(std::vector<std::int64_t>{6, 0, 3, 3}, {4}).to(kGpu);
  auto ok = [](const testing::GradcheckResult& r) { CHECK_MESSAGE(r.ok, r.message); };
  ok(testing::gradcheck([](const auto& v) { return softmax(v[0], 1); }, {x}));
  ok(testing::gradcheck([](const auto& v) { return log_softmax(v[0], 0); }, {x}));
  ok(testing::gradcheck([&](const auto& v) { return cross_entropy(v[0], labels, Reduction::mean, 0.1); }, {x}));
  ok(testing::gradcheck([](const auto& v) { return layer_norm(v[0], {7}); }, {x}));
  ok(testing::gradcheck([](const auto& v) { return batch_norm(v[0], {}, {}, {}, {}, true); }, {x}));
  for (const char* op : {"softmax", "log_softmax"})
    for (const std::string& f : testing::gradcheck_op(get_op(op), kGpu)) FAIL(f);
}

TEST_CASE("dropout: the same seed gives the same mask on CPU and GPU") {
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    Tensor x = ones({1000, 37}, {.dtype = t});
    Generator gc(2024), gg(2024);
    Tensor yc = dropout(x, 0.25, true, &gc), yg = dropout(x.to(kGpu), 0.25, true, &gg);
    CHECK(yc.to_vector<double>() == yg.to(Device::cpu()).to_vector<double>());
    Tensor leaf = x.to(kGpu);
    leaf.requires_grad_();
    Generator g2(2024);
    sum(dropout(leaf, 0.25, true, &g2)).backward();
    CHECK(leaf.grad().to(Device::cpu()).to_vector<double>() == yc.to_vector<double>());
  }
}
