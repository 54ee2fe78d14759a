// dist::GradReducer through NCCL in a world of 1, where the average over ranks is the gradient
// itself: buckets cover every parameter once, finish() leaves the gradients exactly as a plain
// backward, eager and inside a compiled step, and a parameter without a gradient is an error.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "error_message.h"
#include "kiln/dist.h"
#include "kiln/dist/grad_reducer.h"
#include "kiln/kiln.h"
#include "nccl_or_skip.h"
#include "world_of_one.h"

using namespace kiln;
using kiln_test::message_of;

namespace {

struct Net {
  std::shared_ptr<nn::Sequential> net;
  explicit Net(Device d) {
    Generator gen(4);
    net = std::make_shared<nn::Sequential>(nn::Flatten(), nn::Linear(64, 32, true, &gen), nn::ReLU(),
                                           nn::Linear(32, 10, true, &gen));
    net->to(d);
  }
};

std::vector<std::vector<float>> module_grads(const nn::Module& m) {
  std::vector<std::vector<float>> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.grad().to(Device::cpu()).to_vector<float>());
  return out;
}

}  // namespace

TEST_CASE("GradReducer (world of 1): buckets, gradients equal to a plain backward, eager and compiled") {
  if (!kiln_test::nccl_or_skip()) return;
  kiln_test::WorldOfOne world;
  dist::ProcessGroup& pg = world.group;
  const Device dev = pg.device();
  Generator g(9);
  const Tensor x = randn({16, 64}, {}, &g).to(dev), y = randint(0, 10, {16}, {}, &g).to(dev);

  Net plain(dev), reduced(dev);
  cross_entropy((*plain.net)(x), y).backward();
  // A small bucket cap: the 4 parameters (8 KiB, 128 B, 1280 B, 40 B of f32) in 2 buckets, last layer first.
  dist::GradReducer reducer(pg, reduced.net->parameters(), {.bucket_bytes = 2048});
  std::vector<std::size_t> seen;
  for (const auto& b : reducer.buckets()) seen.insert(seen.end(), b.begin(), b.end());
  CHECK(seen == std::vector<std::size_t>{3, 2, 1, 0});
  CHECK(reducer.buckets() == std::vector<std::vector<std::size_t>>{{3, 2, 1}, {0}});
  cross_entropy((*reduced.net)(x), y).backward();
  reducer.finish();
  CHECK(module_grads(*reduced.net) == module_grads(*plain.net));

  // Inside a compiled step: hooks, copies, the all-reduce on its own stream and the join are captured.
  optim::SGD opt_plain(plain.net->parameters(), {.lr = 0.1}), opt_reduced(reduced.net->parameters(), {.lr = 0.1});
  auto step = [&](Net& n, optim::Optimizer& opt, dist::GradReducer* r) {
    return [&n, &opt, r, &x, &y](const std::vector<Tensor>&) {
      opt.zero_grad();
      Tensor loss = cross_entropy((*n.net)(x), y);
      loss.backward();
      if (r) r->finish();
      opt.step();
      return std::vector<Tensor>{loss.detach()};
    };
  };
  CompiledFunction a = compile(step(plain, opt_plain, nullptr), {.device = dev});
  CompiledFunction b = compile(step(reduced, opt_reduced, &reducer), {.device = dev});
  for (int i = 0; i < 4; ++i) {
    CAPTURE(i);
    const float la = a({})[0].item<float>(), lb = b({})[0].item<float>();
    CHECK(std::memcmp(&la, &lb, sizeof la) == 0);
  }
  CHECK(b.stats().captures == 1);
  CHECK(module_grads(*reduced.net) == module_grads(*plain.net));

  // A parameter that gets no gradient leaves its bucket unreduced: finish() says which.
  Net partial(dev);
  const std::vector<Tensor> params = partial.net->parameters();
  dist::GradReducer only_some(pg, params, {.bucket_bytes = 2048});
  Tensor h = relu(linear(x, params[0], params[1]));  // the last layer stays out
  sum(h).backward();
  CHECK(message_of<ValueError>([&] { only_some.finish(); }).find("parameter(s) 2, 3 got no gradient") !=
        std::string::npos);
}
