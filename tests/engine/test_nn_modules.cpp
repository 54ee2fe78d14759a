// nn modules on the CPU: registration and dotted names, PyTorch's initialisation (bounds,
// statistics, determinism, draw order), forwards against the functional ops and hand
// loops, gradients reaching every parameter, train/eval behaviour, batch-norm running
// statistics, describe() and the errors of bad arguments and inputs.
#include <doctest/doctest.h>

#include "error_message.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kiln/kiln.h"

using namespace kiln;
using kiln_test::message_of;

namespace {

Tensor randn_f32(const Shape& s, std::uint64_t seed) {
  Generator g(seed);
  return randn(s, {.dtype = DType::f32}, &g);
}

std::vector<std::string> names_of(const nn::NamedTensors& named) {
  std::vector<std::string> out;
  for (const auto& [name, t] : named) out.push_back(name);
  return out;
}

// conv -> bn -> relu -> pool -> flatten -> linear on (N, 1, 8, 8) inputs.
nn::Sequential small_cnn(Generator* gen) {
  return nn::Sequential(nn::Conv2d(1, 4, {3}, {.padding = {1}}, true, gen), nn::BatchNorm2d(4), nn::ReLU(),
                        nn::MaxPool2d({2}), nn::Flatten(), nn::Linear(4 * 4 * 4, 10, true, gen));
}

// A user-defined module exposing the protected registration calls.
struct Custom : nn::Module {
  Tensor forward(const Tensor& x) override { return x; }
  std::string describe() const override { return "Custom()"; }
  using Module::add_buffer;
  using Module::add_module;
  using Module::add_parameter;
};

}  // namespace

TEST_CASE("nn.Sequential MLP: parameter names, order, shapes and count") {
  Generator gen(1);
  nn::Sequential net(nn::Linear(784, 512, true, &gen), nn::ReLU(), nn::Linear(512, 10, true, &gen));
  const nn::NamedTensors named = net.named_parameters();
  CHECK(names_of(named) == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
  CHECK(named[0].second.shape() == Shape{512, 784});
  CHECK(named[1].second.shape() == Shape{512});
  CHECK(named[2].second.shape() == Shape{10, 512});
  CHECK(net.parameter_count() == 784 * 512 + 512 + 512 * 10 + 10);
  CHECK(net.named_buffers().empty());
  CHECK(net.size() == 3);
  const std::vector<Tensor> params = net.parameters();
  REQUIRE(params.size() == 4);
  for (std::size_t i = 0; i < params.size(); ++i) {
    CHECK(params[i].is_same(named[i].second));
    CHECK(params[i].is_leaf());
    CHECK(params[i].requires_grad());
    CHECK(params[i].dtype() == DType::f32);
  }
  CHECK(net(randn_f32({3, 784}, 2)).shape() == Shape{3, 10});
}

TEST_CASE("nn small CNN: parameters, buffers and state in registration order") {
  Generator gen(3);
  nn::Sequential net = small_cnn(&gen);
  CHECK(names_of(net.named_parameters()) ==
        std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "5.weight", "5.bias"});
  CHECK(names_of(net.named_buffers()) ==
        std::vector<std::string>{"1.running_mean", "1.running_var", "1.num_batches_tracked"});
  CHECK(names_of(net.state()) == std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "5.weight",
                                                          "5.bias", "1.running_mean", "1.running_var",
                                                          "1.num_batches_tracked"});
  CHECK(net.parameter_count() == 4 * 9 + 4 + 4 + 4 + 64 * 10 + 10);
  for (const auto& [name, b] : net.named_buffers()) CHECK_FALSE(b.requires_grad());
  CHECK(net.named_buffers()[2].second.dtype() == DType::i64);
  CHECK(net.named_buffers()[2].second.dim() == 0);
  CHECK(net(randn_f32({2, 1, 8, 8}, 4)).shape() == Shape{2, 10});
}

TEST_CASE("nn nested modules name their tensors with dotted paths") {
  auto inner = std::make_shared<nn::Sequential>(nn::Linear(4, 3), nn::Tanh());
  nn::Sequential outer;
  outer.push_back(nn::Linear(5, 4));
  outer.push_back(inner);
  Custom root;
  root.add_parameter("scale", ones({3}));
  root.add_module("encoder", std::make_shared<nn::Sequential>(std::move(outer)));
  CHECK(names_of(root.named_parameters()) ==
        std::vector<std::string>{"scale", "encoder.0.weight", "encoder.0.bias", "encoder.1.0.weight",
                                 "encoder.1.0.bias"});
  // The child registered by pointer is the same module, not a copy.
  CHECK(root.named_parameters()[3].second.is_same(inner->named_parameters()[0].second));
}

TEST_CASE("nn.Linear forward matches x @ W^T + b and the functional op") {
  Generator gen(5);
  nn::Linear lin(6, 4, true, &gen);
  Tensor x = randn_f32({3, 6}, 6);
  Tensor y = lin(x);
  REQUIRE(y.shape() == Shape{3, 4});
  CHECK(y.to_vector<float>() == linear(x, lin.weight(), lin.bias()).to_vector<float>());
  const auto xv = x.to_vector<double>(), w = lin.weight().to_vector<double>(), b = lin.bias().to_vector<double>();
  const auto yv = y.to_vector<double>();
  for (int n = 0; n < 3; ++n)
    for (int o = 0; o < 4; ++o) {
      double s = b[o];
      for (int i = 0; i < 6; ++i) s += xv[n * 6 + i] * w[o * 6 + i];
      CHECK(yv[n * 4 + o] == doctest::Approx(s).epsilon(1e-5));
    }
  // Without bias: one parameter and x @ W^T; leading batch dims pass through.
  nn::Linear nob(6, 2, false, &gen);
  CHECK_FALSE(nob.bias().defined());
  CHECK(nob.parameters().size() == 1);
  Tensor x3 = randn_f32({2, 3, 6}, 7);
  CHECK(nob(x3).shape() == Shape{2, 3, 2});
  CHECK(nob(x3).to_vector<float>() == linear(x3, nob.weight()).to_vector<float>());
}

TEST_CASE("nn.Conv2d forward matches conv2d with the module's weights") {
  Generator gen(8);
  nn::Conv2d conv(4, 6, {3, 2}, {.stride = {2, 1}, .padding = {1}, .dilation = {1}, .groups = 2}, true, &gen);
  CHECK(conv.weight().shape() == Shape{6, 2, 3, 2});
  CHECK(conv.bias().shape() == Shape{6});
  Tensor x = randn_f32({2, 4, 7, 5}, 9);
  Tensor y = conv(x);
  Tensor want = conv2d(x, conv.weight(), conv.bias(), {.stride = {2, 1}, .padding = {1, 1}, .groups = 2});
  CHECK(y.shape() == want.shape());
  CHECK(y.to_vector<float>() == want.to_vector<float>());
  // One output element by hand: n=1, o=3 (group 1: input channels 2,3), oy=1, ox=2.
  const auto xv = x.to_vector<double>(), w = conv.weight().to_vector<double>();
  double s = conv.bias().to_vector<double>()[3];
  for (int c = 0; c < 2; ++c)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 2; ++j) {
        const int iy = 1 * 2 - 1 + i, ix = 2 - 1 + j;
        if (iy < 0 || iy >= 7 || ix < 0 || ix >= 5) continue;
        s += xv[((1 * 4 + 2 + c) * 7 + iy) * 5 + ix] * w[((3 * 2 + c) * 3 + i) * 2 + j];
      }
  const std::int64_t oh = y.shape()[2], ow = y.shape()[3];
  CHECK(y.to_vector<double>()[((1 * 6 + 3) * oh + 1) * ow + 2] == doctest::Approx(s).epsilon(1e-5));
}

TEST_CASE("nn init: weight then bias drawn as rand * 2b - b, same seed same weights") {
  Generator g1(42), g2(42), g3(43), manual(42);
  nn::Linear a(30, 20, true, &g1), b(30, 20, true, &g2), c(30, 20, true, &g3);
  CHECK(a.weight().to_vector<float>() == b.weight().to_vector<float>());
  CHECK(a.bias().to_vector<float>() == b.bias().to_vector<float>());
  CHECK(a.weight().to_vector<float>() != c.weight().to_vector<float>());
  CHECK(a.bias().to_vector<float>() != c.bias().to_vector<float>());
  // The documented recipe reproduces the module's tensors exactly.
  const double bound = 1.0 / std::sqrt(30.0);
  Tensor w = rand({20, 30}, {.dtype = DType::f32}, &manual) * (2 * bound) - bound;
  Tensor bias = rand({20}, {.dtype = DType::f32}, &manual) * (2 * bound) - bound;
  CHECK(a.weight().to_vector<float>() == w.to_vector<float>());
  CHECK(a.bias().to_vector<float>() == bias.to_vector<float>());
  // Both generators advanced by the same draws, so the next module matches too.
  nn::Conv2d ca(3, 5, {3}, {}, true, &g1), cb(3, 5, {3}, {}, true, &g2);
  CHECK(ca.weight().to_vector<float>() == cb.weight().to_vector<float>());
  // The default generator is used without one, and reseeding repeats it.
  manual_seed(11);
  nn::Linear d1(8, 8);
  manual_seed(11);
  nn::Linear d2(8, 8);
  CHECK(d1.weight().to_vector<float>() == d2.weight().to_vector<float>());
}

TEST_CASE("nn init statistics: mean ~0, variance b^2/3, |w| <= b = 1/sqrt(fan_in)") {
  struct Case {
    std::string name;
    Tensor w, b;
    double fan_in;
  };
  Generator gen(2024);
  nn::Linear lin(1000, 300, true, &gen);
  nn::Conv2d conv(16, 64, {3, 5}, {}, true, &gen);
  nn::Conv2d grouped(8, 128, {3}, {.groups = 2}, true, &gen);
  for (const Case& c : {Case{"linear", lin.weight(), lin.bias(), 1000}, Case{"conv", conv.weight(), conv.bias(), 240},
                        Case{"grouped", grouped.weight(), grouped.bias(), 36}}) {
    const double bound = 1.0 / std::sqrt(c.fan_in);
    for (const Tensor& t : {c.w, c.b}) {
      const auto v = t.to_vector<double>();
      double mean = 0, sq = 0, mx = 0;
      for (double x : v) mean += x, sq += x * x, mx = std::max(mx, std::abs(x));
      mean /= static_cast<double>(v.size());
      const double var = sq / static_cast<double>(v.size()) - mean * mean;
      const double n = static_cast<double>(v.size());
      INFO(c.name, " numel ", v.size());
      CHECK(mx <= bound * (1 + 1e-6));
      // Five standard errors of a U(-b, b) mean and variance.
      CHECK(std::abs(mean) <= 5 * bound / std::sqrt(3 * n));
      CHECK(std::abs(var - bound * bound / 3) <= 5 * bound * bound * std::sqrt(4.0 / 45.0 / n));
    }
    CHECK(c.w.to_vector<double>().size() > 4000);
  }
}

TEST_CASE("nn backward fills every parameter's grad; zero_grad drops them") {
  Generator gen(12);
  nn::Sequential mlp(nn::Linear(20, 16, true, &gen), nn::GELU(), nn::LayerNorm({16}), nn::Linear(16, 5, true, &gen),
                     nn::Sigmoid());
  nn::Sequential cnn = small_cnn(&gen);
  Tensor labels = randint(0, 5, {4}, {}, &gen);
  struct Run {
    nn::Module& net;
    Tensor x;
  };
  for (Run r : {Run{mlp, randn_f32({4, 20}, 13)}, Run{cnn, randn_f32({4, 1, 8, 8}, 14)}}) {
    Tensor loss = cross_entropy(r.net(r.x), labels);
    loss.backward();
    for (const auto& item : r.net.named_parameters()) {
      const auto& name = item.first;  // named, not bound: clang 14 cannot capture bindings
      const auto& p = item.second;
      INFO(name);
      REQUIRE(p.grad().defined());
      CHECK(p.grad().shape() == p.shape());
      CHECK(sum(abs(p.grad())).item<float>() > 0.0f);
    }
    for (const auto& [name, b] : r.net.named_buffers()) CHECK_FALSE(b.grad().defined());
    r.net.zero_grad();
    for (const Tensor& p : r.net.parameters()) CHECK_FALSE(p.grad().defined());
  }
}

TEST_CASE("nn.Linear gradients equal the hand-computed products") {
  Generator gen(15);
  nn::Linear lin(5, 3, true, &gen);
  Tensor x = randn_f32({4, 5}, 16), c = randn_f32({4, 3}, 17);
  sum(lin(x) * c).backward();
  // dL/dW = c^T x, dL/db = column sums of c.
  const auto xv = x.to_vector<double>(), cv = c.to_vector<double>();
  const auto gw = lin.weight().grad().to_vector<double>(), gb = lin.bias().grad().to_vector<double>();
  for (int o = 0; o < 3; ++o) {
    double db = 0;
    for (int n = 0; n < 4; ++n) db += cv[n * 3 + o];
    CHECK(gb[o] == doctest::Approx(db).epsilon(1e-5));
    for (int i = 0; i < 5; ++i) {
      double dw = 0;
      for (int n = 0; n < 4; ++n) dw += cv[n * 3 + o] * xv[n * 5 + i];
      CHECK(gw[o * 5 + i] == doctest::Approx(dw).epsilon(1e-5));
    }
  }
}

TEST_CASE("nn.BatchNorm2d: batch statistics in training, running statistics in eval") {
  nn::BatchNorm2d bn(3);
  Tensor x = randn_f32({4, 3, 5, 5}, 20) * 3.0f + 2.0f;
  const auto xv = x.to_vector<double>();
  // Training: each channel of the output has mean 0 and biased variance ~1.
  const auto y = bn(x).to_vector<double>();
  for (int c = 0; c < 3; ++c) {
    double m = 0, v = 0;
    for (int n = 0; n < 4; ++n)
      for (int i = 0; i < 25; ++i) m += y[(n * 3 + c) * 25 + i];
    m /= 100;
    for (int n = 0; n < 4; ++n)
      for (int i = 0; i < 25; ++i) v += (y[(n * 3 + c) * 25 + i] - m) * (y[(n * 3 + c) * 25 + i] - m);
    CHECK(std::abs(m) < 1e-5);
    CHECK(v / 100 == doctest::Approx(1.0).epsilon(1e-3));
  }
  // Eval: (x - running_mean) / sqrt(running_var + eps), and the statistics stay put.
  bn.eval();
  CHECK_FALSE(bn.is_training());
  const nn::NamedTensors before = bn.named_buffers();
  const auto rm = before[0].second.to_vector<double>(), rv = before[1].second.to_vector<double>();
  const auto ye = bn(x).to_vector<double>();
  for (int n = 0; n < 4; ++n)
    for (int c = 0; c < 3; ++c)
      for (int i = 0; i < 25; ++i) {
        const std::size_t k = static_cast<std::size_t>((n * 3 + c) * 25 + i);
        CHECK(ye[k] == doctest::Approx((xv[k] - rm[c]) / std::sqrt(rv[c] + 1e-5)).epsilon(1e-5));
      }
  CHECK(bn.named_buffers()[0].second.to_vector<double>() == rm);
  CHECK(bn.named_buffers()[2].second.item<std::int64_t>() == 1);
}

TEST_CASE("nn.BatchNorm2d running statistics after training steps equal the hand-computed update") {
  nn::BatchNorm2d bn(2, 1e-5, 0.3);
  const nn::NamedTensors bufs = bn.named_buffers();
  CHECK(bufs[0].second.to_vector<double>() == std::vector<double>{0, 0});
  CHECK(bufs[1].second.to_vector<double>() == std::vector<double>{1, 1});
  std::vector<double> want_mean{0, 0}, want_var{1, 1};
  for (int step = 0; step < 2; ++step) {
    Tensor x = randn_f32({3, 2, 4, 2}, 30 + step) + static_cast<float>(step + 1);
    const auto xv = x.to_vector<double>();
    for (int c = 0; c < 2; ++c) {
      double m = 0, v = 0;
      for (int n = 0; n < 3; ++n)
        for (int i = 0; i < 8; ++i) m += xv[(n * 2 + c) * 8 + i];
      m /= 24;
      for (int n = 0; n < 3; ++n)
        for (int i = 0; i < 8; ++i) v += (xv[(n * 2 + c) * 8 + i] - m) * (xv[(n * 2 + c) * 8 + i] - m);
      want_mean[c] = 0.7 * want_mean[c] + 0.3 * m;
      want_var[c] = 0.7 * want_var[c] + 0.3 * v / 23;  // unbiased
    }
    bn(x);
    // The buffers are updated in place: the handles taken before the step see it.
    const auto rm = bufs[0].second.to_vector<double>(), rv = bufs[1].second.to_vector<double>();
    for (int c = 0; c < 2; ++c) {
      CHECK(rm[c] == doctest::Approx(want_mean[c]).epsilon(1e-5));
      CHECK(rv[c] == doctest::Approx(want_var[c]).epsilon(1e-5));
    }
    CHECK(bufs[2].second.item<std::int64_t>() == step + 1);
  }
}

TEST_CASE("nn.Dropout drops and rescales in training and is the identity in eval") {
  Generator gen(40);
  nn::Dropout drop(0.25, &gen);
  Tensor x = randn_f32({64, 64}, 41);
  const auto xv = x.to_vector<float>(), y = drop(x).to_vector<float>();
  std::size_t zeros_seen = 0;
  for (std::size_t i = 0; i < xv.size(); ++i) {
    if (y[i] == 0.0f) {
      ++zeros_seen;
    } else {
      CHECK(y[i] == doctest::Approx(xv[i] / 0.75f).epsilon(1e-6));
    }
  }
  // 4096 draws at p = 0.25: 1024 expected, standard deviation ~28.
  CHECK(zeros_seen > 900);
  CHECK(zeros_seen < 1150);
  // eval() through a container reaches the child.
  nn::Sequential net(nn::Linear(64, 64), nn::Dropout(0.5, &gen));
  net.eval();
  CHECK_FALSE(net[1].is_training());
  Tensor h = net[0](x);
  CHECK(net(x).to_vector<float>() == h.to_vector<float>());
  net.train();
  CHECK(net[1].is_training());
  CHECK(net(x).to_vector<float>() != h.to_vector<float>());
}

TEST_CASE("nn pooling, normalisation, flatten and activation modules match their functions") {
  Tensor x = randn_f32({2, 3, 6, 6}, 50);
  CHECK(nn::MaxPool2d({2})(x).to_vector<float>() == max_pool2d(x, {2}).to_vector<float>());
  CHECK(nn::MaxPool2d({3}, {2}, {1})(x).to_vector<float>() == max_pool2d(x, {3}, {2}, {1}).to_vector<float>());
  CHECK(nn::AvgPool2d({2, 3})(x).shape() == Shape{2, 3, 3, 2});
  CHECK(nn::AvgPool2d({2, 3})(x).to_vector<float>() == avg_pool2d(x, {2, 3}).to_vector<float>());
  nn::LayerNorm ln({6, 6});
  CHECK(ln(x).to_vector<float>() == layer_norm(x, {6, 6}).to_vector<float>());
  CHECK(nn::Flatten()(x).shape() == Shape{2, 108});
  CHECK(nn::Flatten(0, 1)(x).shape() == Shape{6, 6, 6});
  CHECK(nn::ReLU()(x).to_vector<float>() == relu(x).to_vector<float>());
  CHECK(nn::GELU()(x).to_vector<float>() == gelu(x).to_vector<float>());
  CHECK(nn::Sigmoid()(x).to_vector<float>() == sigmoid(x).to_vector<float>());
  CHECK(nn::Tanh()(x).to_vector<float>() == tanh(x).to_vector<float>());
  CHECK(nn::Sequential()(x).is_same(x));
}

TEST_CASE("nn describe: one line per layer, containers indented") {
  nn::Sequential inner(nn::Conv2d(1, 8, {3}, {.padding = {1}}), nn::BatchNorm2d(8), nn::MaxPool2d({2}));
  nn::Sequential net;
  net.push_back(std::move(inner));
  net.push_back(nn::Flatten());
  net.push_back(nn::Dropout(0.25));
  net.push_back(nn::Linear(8 * 14 * 14, 10, false));
  CHECK(net.describe() ==
        "Sequential(\n"
        "  (0): Sequential(\n"
        "    (0): Conv2d(in=1, out=8, kernel=(3,3), stride=(1,1), padding=(1,1), bias=true)\n"
        "    (1): BatchNorm2d(8, eps=1e-05, momentum=0.1)\n"
        "    (2): MaxPool2d(kernel=(2,2), stride=(2,2), padding=(0,0))\n"
        "  )\n"
        "  (1): Flatten(start=1, end=-1)\n"
        "  (2): Dropout(p=0.25)\n"
        "  (3): Linear(in=1568, out=10, bias=false)\n"
        ")");
  CHECK(nn::Conv2d(4, 4, {3, 1}, {.dilation = {2}, .groups = 4}).describe() ==
        "Conv2d(in=4, out=4, kernel=(3,1), stride=(1,1), padding=(0,0), dilation=(2,2), groups=4, bias=true)");
  CHECK(nn::LayerNorm({16}).describe() == "LayerNorm((16,), eps=1e-05)");
  CHECK(nn::AvgPool2d({2}, {1}).describe() == "AvgPool2d(kernel=(2,2), stride=(1,1), padding=(0,0))");
  CHECK(nn::GELU().describe() == "GELU()");
  CHECK(nn::Sequential().describe() == "Sequential()");
}

TEST_CASE("nn to(cpu) keeps the same leaves; to(cuda) without a GPU throws and keeps them") {
  Generator gen(60);
  nn::Sequential net = small_cnn(&gen);
  const std::vector<Tensor> before = net.parameters();
  net.to(Device::cpu());
  const std::vector<Tensor> after = net.parameters();
  REQUIRE(after.size() == before.size());
  for (std::size_t i = 0; i < after.size(); ++i) {
    CHECK(after[i].is_same(before[i]));
    CHECK(after[i].is_leaf());
    CHECK(after[i].requires_grad());
  }
  if (cuda_device_count() == 0) {
    CHECK_THROWS_AS(net.to(Device::cuda(0)), DeviceError);
    CHECK(net.parameters()[0].is_same(before[0]));
    CHECK(net.parameters()[0].device() == Device::cpu());
  }
}

TEST_CASE("nn registration rejects empty, dotted and duplicate names") {
  Custom m;
  m.add_parameter("w", zeros({2}));
  m.add_buffer("stat", zeros({2}));
  m.add_module("child", std::make_shared<nn::ReLU>());
  CHECK(message_of<ValueError>([&] { m.add_parameter("", zeros({1})); }) ==
        "[nn.Module] parameter name must not be empty");
  CHECK(message_of<ValueError>([&] { m.add_parameter("a.b", zeros({1})); }) ==
        "[nn.Module] parameter name 'a.b' must not contain '.'");
  CHECK(message_of<ValueError>([&] { m.add_parameter("w", zeros({1})); }) ==
        "[nn.Module] parameter name 'w' is already registered");
  CHECK_THROWS_AS(m.add_buffer("w", zeros({1})), ValueError);
  CHECK_THROWS_AS(m.add_parameter("stat", zeros({1})), ValueError);
  CHECK_THROWS_AS(m.add_module("stat", std::make_shared<nn::ReLU>()), ValueError);
  CHECK_THROWS_AS(m.add_parameter("child", zeros({1})), ValueError);
  CHECK_THROWS_AS(m.add_module("x.y", std::make_shared<nn::ReLU>()), ValueError);
  CHECK_THROWS_AS(m.add_module("null", nullptr), ValueError);
  CHECK_THROWS_AS(m.add_parameter("undefined", Tensor()), ValueError);
  CHECK(message_of<DTypeError>([&] { m.add_parameter("idx", zeros({1}, {.dtype = DType::i64})); })
            .starts_with("[nn.Module] parameter 'idx' must be floating"));
  // A parameter made by recorded ops is cut from its graph and becomes a leaf.
  Tensor src = ones({2});
  src.requires_grad_();
  m.add_parameter("derived", src * 2.0f);
  CHECK(m.named_parameters().back().second.is_leaf());
  CHECK(m.named_parameters().back().second.requires_grad());
  CHECK(names_of(m.named_parameters()) == std::vector<std::string>{"w", "derived"});
}

TEST_CASE("nn bad constructor arguments and inputs throw typed errors naming the layer") {
  CHECK(message_of<ShapeError>([] {
          nn::Linear lin(784, 10);
          lin(zeros({32, 100}));
        }) == "[nn.Linear] expected input (..., 784), got (32,100)");
  CHECK(message_of<ShapeError>([] {
          nn::Conv2d conv(3, 8, {3});
          conv(zeros({2, 1, 8, 8}));
        }) == "[nn.Conv2d] expected input (N, 3, H, W), got (2,1,8,8)");
  CHECK_THROWS_AS(nn::Conv2d(3, 8, {3})(zeros({3, 8, 8})), ShapeError);
  CHECK(message_of<ShapeError>([] { nn::BatchNorm2d(4)(zeros({2, 3, 2, 2})); })
            .starts_with("[nn.BatchNorm2d] expected input (N, 4, H, W)"));
  CHECK(message_of<ShapeError>([] { nn::LayerNorm({4})(zeros({2, 3})); }) ==
        "[nn.LayerNorm] expected input (..., 4), got (2,3)");
  CHECK(message_of<ShapeError>([] { nn::MaxPool2d({2})(zeros({4, 4})); }).starts_with("[nn.MaxPool2d]"));
  CHECK(message_of<ValueError>([] { nn::Linear(0, 5); }) == "[nn.Linear] in must be positive; got 0");
  CHECK_THROWS_AS(nn::Linear(5, -1), ValueError);
  CHECK(message_of<ValueError>([] { nn::Conv2d(3, 4, {0}); }).starts_with("[nn.Conv2d] kernel must be >= 1"));
  CHECK_THROWS_AS(nn::Conv2d(3, 4, {3, 3, 3}), ValueError);
  CHECK_THROWS_AS(nn::Conv2d(3, 4, {3}, {.stride = {0}}), ValueError);
  CHECK_THROWS_AS(nn::Conv2d(3, 4, {3}, {.padding = {-1}}), ValueError);
  CHECK(message_of<ValueError>([] { nn::Conv2d(3, 4, {3}, {.groups = 2}); }).starts_with("[nn.Conv2d] in (3)"));
  CHECK(message_of<ValueError>([] { nn::Dropout(1.0); }) == "[nn.Dropout] p must be in [0, 1); got 1");
  CHECK_THROWS_AS(nn::Dropout(-0.1), ValueError);
  CHECK_THROWS_AS(nn::BatchNorm2d(0), ValueError);
  CHECK_THROWS_AS(nn::BatchNorm2d(4, 0.0), ValueError);
  CHECK_THROWS_AS(nn::BatchNorm2d(4, 1e-5, 1.5), ValueError);
  CHECK_THROWS_AS(nn::LayerNorm({}), ValueError);
  CHECK_THROWS_AS(nn::LayerNorm({4, 0}), ValueError);
  CHECK(message_of<ValueError>([] { nn::MaxPool2d({2}, {}, {2}); }).starts_with("[nn.MaxPool2d] padding (2,2)"));
  CHECK_THROWS_AS(nn::AvgPool2d({2}, {0}), ValueError);
  nn::Sequential net{nn::ReLU()};
  CHECK(message_of<ValueError>([&] { (void)net[1]; }) == "[nn.Sequential] index 1 is out of range for 1 modules");
  CHECK_THROWS_AS(net.push_back(std::shared_ptr<nn::Module>()), ValueError);
}
