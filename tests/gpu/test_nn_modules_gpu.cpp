// nn modules on cuda:0 against the same modules on the CPU: an MLP and a CNN (with
// batch norm and dropout) built twice from one seed, one copy moved to the GPU. The
// moved parameters are leaves that require grad and equal the CPU ones bit for bit; one
// training forward+backward gives the same logits, loss, gradients and running
// statistics within tolerance, and an eval forward agrees too.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "conv_tf32.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

// |gpu - cpu| <= atol + rtol * |cpu| everywhere; the first mismatches are printed.
void check_close(const std::string& what, const Tensor& cpu, const Tensor& gpu, double atol, double rtol) {
  REQUIRE_MESSAGE(cpu.shape() == gpu.shape(), what);
  CHECK_MESSAGE(gpu.device() == Device::cuda(0), what);
  const auto c = cpu.to(DType::f64).to_vector<double>();
  const auto g = gpu.to(Device::cpu()).to(DType::f64).to_vector<double>();
  std::ostringstream msg;
  int bad = 0;
  for (std::size_t i = 0; i < c.size(); ++i) {
    if (std::abs(g[i] - c[i]) <= atol + rtol * std::abs(c[i])) continue;
    if (bad++ < 5) msg << "\n  [" << i << "] cpu " << c[i] << " gpu " << g[i];
  }
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " of ", c.size(), " differ", msg.str());
}

struct Pair {
  nn::Module& cpu;
  nn::Module& gpu;
};

// Moves `p.gpu` to cuda:0 and checks its tensors: same names and values, leaves on the GPU.
void move_and_check(const Pair& p) {
  p.gpu.to(Device::cuda(0));
  const nn::NamedTensors c = p.cpu.state(), g = p.gpu.state();
  REQUIRE(c.size() == g.size());
  const std::size_t n_params = p.cpu.named_parameters().size();
  for (std::size_t i = 0; i < c.size(); ++i) {
    INFO(g[i].first);
    CHECK(g[i].first == c[i].first);
    CHECK(g[i].second.device() == Device::cuda(0));
    CHECK(g[i].second.is_leaf());
    CHECK(g[i].second.requires_grad() == (i < n_params));
    CHECK(g[i].second.to(Device::cpu()).to(DType::f64).to_vector<double>() ==
          c[i].second.to(DType::f64).to_vector<double>());
  }
  for (const Tensor& t : p.gpu.parameters()) CHECK_FALSE(t.grad().defined());
}

// One cross-entropy forward+backward on each device from the same host input and labels.
void step_and_compare(const std::string& name, const Pair& p, const Tensor& x, const Tensor& labels) {
  Tensor lc = p.cpu(x), lg = p.gpu(x.to(Device::cuda(0)));
  check_close(name + " logits", lc, lg, 1e-4, 1e-4);
  Tensor loss_c = cross_entropy(lc, labels), loss_g = cross_entropy(lg, labels.to(Device::cuda(0)));
  CHECK(loss_g.item<float>() == doctest::Approx(loss_c.item<float>()).epsilon(1e-5));
  loss_c.backward();
  loss_g.backward();
  const nn::NamedTensors c = p.cpu.named_parameters(), g = p.gpu.named_parameters();
  for (std::size_t i = 0; i < c.size(); ++i) {
    REQUIRE_MESSAGE(g[i].second.grad().defined(), g[i].first);
    CHECK(g[i].second.grad().device() == Device::cuda(0));
    // Gradients are small sums of products: scale the absolute tolerance to the largest one.
    const auto cg = c[i].second.grad().to_vector<double>();
    double scale = 0;
    for (double v : cg) scale = std::max(scale, std::abs(v));
    check_close(name + " grad of " + c[i].first, c[i].second.grad(), g[i].second.grad(), 1e-4 * scale + 1e-7, 1e-3);
  }
  const nn::NamedTensors cb = p.cpu.named_buffers(), gb = p.gpu.named_buffers();
  for (std::size_t i = 0; i < cb.size(); ++i) check_close(name + " " + cb[i].first, cb[i].second, gb[i].second, 1e-5, 1e-5);
}

Tensor input(const Shape& s, std::uint64_t seed) {
  Generator g(seed);
  return randn(s, {.dtype = DType::f32}, &g);
}

}  // namespace

TEST_CASE("nn MLP on cuda:0 matches the CPU module: parameters, forward and gradients") {
  Generator gc(7), gg(7);
  nn::Sequential cpu(nn::Linear(784, 512, true, &gc), nn::ReLU(), nn::Linear(512, 512, true, &gc), nn::ReLU(),
                     nn::Linear(512, 10, true, &gc));
  nn::Sequential gpu(nn::Linear(784, 512, true, &gg), nn::ReLU(), nn::Linear(512, 512, true, &gg), nn::ReLU(),
                     nn::Linear(512, 10, true, &gg));
  Pair p{cpu, gpu};
  move_and_check(p);
  Generator lg(8);
  Tensor labels = randint(0, 10, {64}, {}, &lg);
  step_and_compare("mlp", p, input({64, 784}, 9), labels);
  // Gradients accumulate on the device; zero_grad drops them.
  gpu.zero_grad();
  for (const Tensor& t : gpu.parameters()) CHECK_FALSE(t.grad().defined());
}

TEST_CASE("nn CNN with batch norm and dropout on cuda:0 matches the CPU module, in train and eval") {
  const kiln_test::ConvTF32 exact(false);  // compared at f32 tolerances
  // Separate generators with one seed: the same weights and, via Philox, the same dropout masks.
  Generator gc(21), gg(21), dc(22), dg(22);
  auto cnn = [](Generator* init, Generator* drop) {
    nn::Sequential net(nn::Conv2d(1, 8, {3}, {.padding = {1}}, true, init), nn::BatchNorm2d(8), nn::ReLU(),
                       nn::MaxPool2d({2}), nn::Conv2d(8, 16, {3}, {.padding = {1}}, true, init), nn::BatchNorm2d(16),
                       nn::ReLU(), nn::AvgPool2d({2}), nn::Flatten(), nn::Dropout(0.25, drop),
                       nn::Linear(16 * 7 * 7, 10, true, init));
    return net;
  };
  nn::Sequential cpu = cnn(&gc, &dc), gpu = cnn(&gg, &dg);
  Pair p{cpu, gpu};
  move_and_check(p);
  Generator lg(23);
  Tensor labels = randint(0, 10, {16}, {}, &lg);
  Tensor x = input({16, 1, 28, 28}, 24);
  step_and_compare("cnn train", p, x, labels);
  CHECK(gpu.named_buffers()[2].second.to(Device::cpu()).item<std::int64_t>() == 1);
  cpu.eval();
  gpu.eval();
  NoGradGuard no_grad;
  check_close("cnn eval logits", cpu(x), gpu(x.to(Device::cuda(0))), 1e-4, 1e-4);
}

TEST_CASE("nn to(cuda) moves existing gradients and to(cpu) brings the module back") {
  Generator gen(31);
  nn::Linear lin(16, 4, true, &gen);
  Tensor x = input({5, 16}, 32);
  sum(lin(x)).backward();
  const auto grad_cpu = lin.weight().grad().to_vector<float>();
  const auto w_cpu = lin.weight().to_vector<float>();
  lin.to(Device::cuda(0));
  REQUIRE(lin.weight().grad().defined());
  CHECK(lin.weight().grad().device() == Device::cuda(0));
  CHECK(lin.weight().grad().to(Device::cpu()).to_vector<float>() == grad_cpu);
  lin.to(Device::cpu());
  CHECK(lin.weight().device() == Device::cpu());
  CHECK(lin.weight().is_leaf());
  CHECK(lin.weight().requires_grad());
  CHECK(lin.weight().to_vector<float>() == w_cpu);
}
