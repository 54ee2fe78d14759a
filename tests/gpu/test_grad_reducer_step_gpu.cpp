// dist::GradReducer::finish(opt) through NCCL in a world of 1: each piece's parameters (or spans
// of them) updated as soon as its all-reduce completes gives the weights of whole buckets'
// finish() then opt.step(), bit for bit, eager and inside a compiled step, with a parameter
// outside the reducer updated last; with gradients as bucket views or copied, and a bf16 wire.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/dist.h"
#include "kiln/dist/grad_reducer.h"
#include "kiln/kiln.h"
#include "nccl_or_skip.h"
#include "world_of_one.h"

using namespace kiln;

namespace {

std::shared_ptr<nn::Sequential> three_layers(Device d) {
  Generator gen(7);
  auto net =
      std::make_shared<nn::Sequential>(nn::Flatten(), nn::Linear(64, 48, true, &gen), nn::ReLU(),
                                       nn::Linear(48, 32, true, &gen), nn::ReLU(), nn::Linear(32, 10, true, &gen));
  net->to(d);
  return net;
}

std::vector<std::vector<float>> weights(const nn::Module& m) {
  std::vector<std::vector<float>> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.to(Device::cpu()).to_vector<float>());
  return out;
}

bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
      return false;
  return true;
}

}  // namespace

TEST_CASE("GradReducer::finish(opt) (world of 1): per-piece updates equal finish() then step(), bit for bit") {
  if (!kiln_test::nccl_or_skip()) return;
  kiln_test::WorldOfOne world;
  dist::ProcessGroup& pg = world.group;
  const Device dev = pg.device();
  Generator g(3);
  const Tensor x = randn({32, 64}, {}, &g).to(dev), y = randint(0, 10, {32}, {}, &g).to(dev);

  const dist::ReducerOptions whole{.bucket_bytes = 4096, .first_bucket_bytes = 0, .piece_bytes = 0};
  dist::ReducerOptions pieces = whole, copied, bf16_wire;
  pieces.piece_bytes = 1024;  // the 48x64 layer's 12 KiB in 12 pieces, the others in several
  copied = pieces;
  copied.grad_as_bucket_view = false;
  bf16_wire = pieces;
  bf16_wire.wire_dtype = DType::bf16;
  const std::vector<std::pair<std::string, dist::ReducerOptions>> settings = {
      {"whole buckets", whole}, {"pieces", pieces}, {"pieces, copied", copied}, {"pieces, bf16 wire", bf16_wire}};
  for (const auto& entry : settings)
    for (bool compiled : {false, true}) {
      const std::string& setting = entry.first;  // named, not bound: lambdas capture it
      const dist::ReducerOptions& options = entry.second;
      CAPTURE(setting);
      CAPTURE(compiled);
      auto ref_net = three_layers(dev), net = three_layers(dev);
      // The first layer's bias stays out of the reducers: the optimizer updates it after the buckets.
      auto reduced = [](const nn::Module& m) {
        std::vector<Tensor> p = m.parameters();
        p.erase(p.begin() + 1);
        return p;
      };
      dist::ReducerOptions ref_options = options;
      ref_options.piece_bytes = 0;
      dist::GradReducer ref_reducer(pg, reduced(*ref_net), ref_options), reducer(pg, reduced(*net), options);
      REQUIRE(reducer.buckets().size() >= 3);
      CHECK(ref_reducer.pieces() == std::vector<std::size_t>(reducer.buckets().size(), 1));
      const std::vector<std::size_t> cut = reducer.pieces();
      if (options.piece_bytes > 0) CHECK(*std::max_element(cut.begin(), cut.end()) > 1);
      // SGD with momentum where gradients are copied: a buffer made in a step that updates a
      // parameter in several spans is new for each of them.
      auto make_opt = [&setting](std::vector<Tensor> p) -> std::unique_ptr<optim::Optimizer> {
        if (setting == "pieces, copied")
          return std::make_unique<optim::SGD>(std::move(p), optim::SgdOptions{.lr = 1e-2, .momentum = 0.9});
        return std::make_unique<optim::Adam>(std::move(p), optim::AdamOptions{.lr = 1e-2});
      };
      std::unique_ptr<optim::Optimizer> ref_opt = make_opt(ref_net->parameters()), opt = make_opt(net->parameters());
      auto step = [&x, &y](nn::Module& m, optim::Optimizer& o, dist::GradReducer& r, bool per_bucket) {
        return [&m, &o, &r, per_bucket, &x, &y](const std::vector<Tensor>&) {
          o.zero_grad();
          Tensor loss = cross_entropy(m(x), y);
          loss.backward();
          if (per_bucket) {
            r.finish(o);
          } else {
            r.finish();
            o.step();
          }
          return std::vector<Tensor>{loss.detach()};
        };
      };
      StepFunction a = step(*ref_net, *ref_opt, ref_reducer, false), b = step(*net, *opt, reducer, true);
      std::optional<CompiledFunction> ca, cb;
      if (compiled) {
        ca.emplace(compile(a, {.device = dev}));
        cb.emplace(compile(b, {.device = dev}));
      }
      for (int i = 0; i < 5; ++i) {
        CAPTURE(i);
        const float la = (ca ? (*ca)({}) : a({}))[0].item<float>(), lb = (cb ? (*cb)({}) : b({}))[0].item<float>();
        CHECK(std::memcmp(&la, &lb, sizeof la) == 0);
        CHECK(same_bits(weights(*net), weights(*ref_net)));
      }
      CHECK(opt->steps() == ref_opt->steps());
      if (cb) CHECK(cb->stats().captures == 1);
      CHECK(!same_bits(weights(*net), weights(*three_layers(dev))));  // the steps did train
    }
}
