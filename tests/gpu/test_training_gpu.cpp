// A few training steps of the trainer's networks on the GPU track the same steps on the CPU:
// one seed gives identical initial weights (Philox on the CPU, then moved), the same batch
// goes to both, and the losses agree step by step within f32 rounding.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "../../examples/mnist/models.h"
#include "conv_tf32.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

std::vector<double> losses(const std::string& model, Device device, int steps) {
  Generator gen(11);
  auto net = mnist::make_model(model, gen);
  net->to(device);
  optim::Adam opt(net->parameters(), {.lr = 1e-3});
  Generator data_gen(5);
  const Tensor x = randn({32, 1, 28, 28}, {}, &data_gen).to(device);
  const Tensor y = randint(0, 10, {32}, {}, &data_gen).to(device);
  std::vector<double> out;
  for (int i = 0; i < steps; ++i) {
    Tensor loss = cross_entropy((*net)(x), y);
    loss.backward();
    opt.step();
    opt.zero_grad();
    out.push_back(loss.item<double>());
  }
  return out;
}

}  // namespace

TEST_CASE("training steps on the GPU match the CPU from the same seed") {
  const kiln_test::ConvTF32 exact(false);  // f32 on both devices; TF32 would round the convs
  for (const char* model : {"mlp", "cnn"}) {
    CAPTURE(model);
    const auto cpu = losses(model, Device::cpu(), 6);
    const auto gpu = losses(model, Device::cuda(0), 6);
    CHECK(cpu.back() < cpu.front());  // it learns the batch
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      CAPTURE(i);
      CHECK(std::abs(gpu[i] - cpu[i]) <= 2e-3 * std::abs(cpu[i]) + 1e-4);
    }
  }
}
