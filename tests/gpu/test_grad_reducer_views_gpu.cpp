// dist::GradReducer's options through NCCL in a world of 1: after finish() the gradients are
// views into their bucket, 256-byte aligned, last layer first (or private copies with
// grad_as_bucket_view off), and a bf16 wire leaves each gradient rounded to bf16.
#include <doctest/doctest.h>

#include <cstdint>
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

std::shared_ptr<nn::Sequential> small_net(Device d) {
  Generator gen(4);
  auto net = std::make_shared<nn::Sequential>(nn::Flatten(), nn::Linear(64, 32, true, &gen), nn::ReLU(),
                                              nn::Linear(32, 10, true, &gen));
  net->to(d);
  return net;
}

std::vector<std::vector<float>> module_grads_rounded(const nn::Module& m, std::optional<DType> rounded_to = std::nullopt) {
  std::vector<std::vector<float>> out;
  for (const Tensor& p : m.parameters()) {
    Tensor g = rounded_to ? p.grad().to(*rounded_to).to(DType::f32) : p.grad();
    out.push_back(g.to(Device::cpu()).to_vector<float>());
  }
  return out;
}

std::uintptr_t address(const Tensor& t) { return reinterpret_cast<std::uintptr_t>(t.data_ptr()); }

}  // namespace

TEST_CASE("GradReducer (world of 1): gradients as bucket views, private copies, bf16 on the wire") {
  if (!kiln_test::nccl_or_skip()) return;
  kiln_test::WorldOfOne world;
  dist::ProcessGroup& pg = world.group;
  const Device dev = pg.device();
  Generator g(9);
  const Tensor x = randn({16, 64}, {}, &g).to(dev), y = randint(0, 10, {16}, {}, &g).to(dev);
  auto plain = small_net(dev);
  cross_entropy((*plain)(x), y).backward();

  // Defaults: all 4 parameters (under 1 MiB) in the first bucket, in order, each view 256-byte
  // aligned.
  auto viewed = small_net(dev);
  dist::GradReducer by_view(pg, viewed->parameters());
  CHECK(by_view.buckets() == std::vector<std::vector<std::size_t>>{{3, 2, 1, 0}});
  cross_entropy((*viewed)(x), y).backward();
  by_view.finish();
  CHECK(module_grads_rounded(*viewed) == module_grads_rounded(*plain));
  const std::vector<Tensor> p = viewed->parameters();
  CHECK(address(p[3].grad()) % 256 == 0);
  for (std::size_t k = 3; k > 0; --k) {
    CAPTURE(k);
    CHECK(address(p[k - 1].grad()) % 256 == 0);
    CHECK(address(p[k - 1].grad()) == (address(p[k].grad()) + p[k].numel() * sizeof(float) + 255) / 256 * 256);
  }
  // The next eager backward makes new gradients; finish() points .grad() at the views again.
  for (Tensor t : viewed->parameters()) t.zero_grad();
  cross_entropy((*viewed)(x), y).backward();
  const std::uintptr_t fresh = address(p[0].grad());
  by_view.finish();
  CHECK(address(p[0].grad()) != fresh);
  CHECK(module_grads_rounded(*viewed) == module_grads_rounded(*plain));

  auto copied = small_net(dev);
  dist::GradReducer by_copy(pg, copied->parameters(), {.grad_as_bucket_view = false});
  cross_entropy((*copied)(x), y).backward();
  const std::uintptr_t own = address(copied->parameters()[0].grad());
  by_copy.finish();
  CHECK(address(copied->parameters()[0].grad()) == own);
  CHECK(module_grads_rounded(*copied) == module_grads_rounded(*plain));

  // The average of one rank's bf16 gradients is those gradients: f32 rounded to bf16.
  auto wired = small_net(dev);
  dist::GradReducer by_wire(pg, wired->parameters(), {.wire_dtype = DType::bf16});
  cross_entropy((*wired)(x), y).backward();
  by_wire.finish();
  CHECK(module_grads_rounded(*wired) == module_grads_rounded(*plain, DType::bf16));
  CHECK(module_grads_rounded(*wired) != module_grads_rounded(*plain));

  CHECK(message_of<DTypeError>([&] {
          dist::GradReducer bad(pg, small_net(dev)->parameters(), {.wire_dtype = DType::f64});
        }).find("[dist.GradReducer] wire_dtype must be bf16 or f16") == 0);
}
