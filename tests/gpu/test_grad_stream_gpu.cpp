// Weight gradients on a second stream inside compiled steps (kiln::set_weight_grad_stream): the
// same kernels on other streams, so the same bits as on one stream and as eager, with a
// shorter chain of kernels in the graph; a gradient's ready hook sees the finished gradient.
#include <doctest/doctest.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpu_match.h"
#include "kiln/kiln.h"
#include "scoped_env.h"

using namespace kiln;

namespace {

using kiln_test::f32_bits;
using kiln_test::kGpu;

// Restores the switch when the test ends.
struct GradStreamSwitch {
  bool before = weight_grad_stream();
  explicit GradStreamSwitch(bool on) { set_weight_grad_stream(on); }
  ~GradStreamSwitch() { set_weight_grad_stream(before); }
};

struct GradStreamOutcome {
  std::vector<std::uint32_t> losses;
  std::vector<std::vector<std::uint32_t>> params;
  CompileStats stats;
};

// What runs between a step's backward and its optimizer step; with `detached_read`, a loss term
// whose vjp reads the last layer's weight (detached) after that weight's gradient is final.
enum class Between { nothing, scale_grads, detached_read };

// An mlp trained by Adam (or SGD with momentum) for `steps` steps on fixed batches, compiled or
// eager, under autocast to `amp` when given.
GradStreamOutcome train_mlp_side(bool compiled, bool side, std::optional<DType> amp, int steps = 6, bool sgd = false,
                                 Between between = Between::nothing) {
  const GradStreamSwitch on(side);
  Generator gen(21);
  nn::Sequential net(nn::Linear(96, 128, true, &gen), nn::ReLU(), nn::Linear(128, 64, true, &gen), nn::ReLU(),
                     nn::Linear(64, 10, true, &gen));
  net.to(kGpu);
  std::unique_ptr<optim::Optimizer> opt;
  if (sgd)
    opt = std::make_unique<optim::SGD>(net.parameters(), optim::SgdOptions{.lr = 0.05, .momentum = 0.9});
  else
    opt = std::make_unique<optim::Adam>(net.parameters(), optim::AdamOptions{.lr = 1e-3});
  Generator data(3);
  const Tensor x = randn({32, 96}, {}, &data).to(kGpu), y = randint(0, 10, {32}, {}, &data).to(kGpu);
  StepFunction fn = [&](const std::vector<Tensor>& in) {
    opt->zero_grad();
    Tensor loss;
    {
      AutocastGuard guard(amp);
      if (between == Between::detached_read) {
        // Made before the layers above the first, so the backward reaches its vjp after theirs.
        const Tensor h1 = relu(net[0](in[0]));
        const Tensor w3 = net.parameters()[4].detach();
        const Tensor extra = mul(sum(matmul(narrow(h1, 1, 0, 64), transpose(w3, 0, 1))), 1e-3);
        const Tensor out = net[4](relu(net[2](h1)));
        loss = add(cross_entropy(out, in[1]), extra);
      } else {
        loss = cross_entropy(net(in[0]), in[1]);
      }
    }
    loss.backward();
    if (between == Between::scale_grads)
      for (const Tensor& p : net.parameters()) {
        Tensor g = p.grad();
        g.mul_(0.5);
      }
    opt->step();
    return std::vector<Tensor>{loss.detach()};
  };
  CompiledFunction cf = compile(fn);
  GradStreamOutcome o;
  for (int i = 0; i < steps; ++i) o.losses.push_back(f32_bits(compiled ? cf({x, y})[0] : fn({x, y})[0])[0]);
  for (const Tensor& p : net.parameters()) o.params.push_back(f32_bits(p));
  o.stats = cf.stats();
  return o;
}

}  // namespace

TEST_CASE("weight gradients beside the backward's chain: the same bits as one stream and as eager") {
  for (const std::optional<DType> amp : {std::optional<DType>(), std::optional<DType>(DType::bf16)}) {
    const std::string name = amp ? "bf16" : "f32";
    CAPTURE(name);
    const GradStreamOutcome eager = train_mlp_side(false, true, amp);
    const GradStreamOutcome one = train_mlp_side(true, false, amp);
    const GradStreamOutcome two = train_mlp_side(true, true, amp);
    CHECK(two.losses == one.losses);
    CHECK(two.params == one.params);
    CHECK(two.losses == eager.losses);
    CHECK(two.params == eager.params);
    CHECK(eager.losses.front() != eager.losses.back());  // it trains
    REQUIRE(one.stats.kernels_per_graph.size() == 1);
    REQUIRE(two.stats.kernels_per_graph.size() == 1);
    // The same kernels, but for the optimizer's update in two launches (below).
    CHECK(two.stats.kernels_per_graph[0] == one.stats.kernels_per_graph[0] + 1);
    // One stream: every kernel follows the one before. Two: the weight products leave the chain.
    CHECK(one.stats.kernel_chain_per_graph.at(0) == one.stats.kernels_per_graph[0]);
    CHECK(two.stats.kernel_chain_per_graph.at(0) < two.stats.kernels_per_graph[0]);
    // The chain's kernels by name: on one stream every kernel, in the order they ran (Adam's step
    // last); with two, a part of them that still ends with the step.
    const auto named = [](const std::vector<std::string>& chain) {
      std::map<std::string, std::size_t> by_name;
      for (const std::string& k : chain) ++by_name[k];
      return by_name;
    };
    for (const GradStreamOutcome* o : {&one, &two}) {
      const std::vector<std::string>& chain = o->stats.chain_kernels_per_graph.at(0);
      CHECK(chain.size() == o->stats.kernel_chain_per_graph[0]);
      REQUIRE(!chain.empty());
      CHECK(chain.back() == "kiln_adam_step");
      for (const auto& [kernel, count] : named(chain)) CHECK(count <= o->stats.kernel_names_per_graph[0].at(kernel));
    }
    CHECK(named(one.stats.chain_kernels_per_graph[0]) == one.stats.kernel_names_per_graph[0]);
    // With the side streams, the two later layers' parameters update beside the first layer's
    // weight product: the step's update in two launches.
    CHECK(one.stats.kernel_names_per_graph[0].at("kiln_adam_step") == 1);
    CHECK(two.stats.kernel_names_per_graph[0].at("kiln_adam_step") == 2);
    MESSAGE(name << ": " << two.stats.kernels_per_graph[0] << " kernels, the longest chain "
                 << two.stats.kernel_chain_per_graph[0] << " with the second stream");
  }
}

TEST_CASE("updates before the backward's end: the same bits; none after other work on the gradients") {
  for (const bool sgd : {false, true})
    for (const Between between : {Between::nothing, Between::scale_grads, Between::detached_read}) {
      const std::string name = std::string(sgd ? "SGD" : "Adam") + (between == Between::scale_grads     ? ", scaled"
                                                                    : between == Between::detached_read ? ", detached"
                                                                                                        : "");
      CAPTURE(name);
      // In f32 the detached weight itself is saved for the backward, not a cast of it.
      const std::optional<DType> amp =
          between == Between::detached_read ? std::nullopt : std::optional<DType>(DType::bf16);
      const GradStreamOutcome eager = train_mlp_side(false, true, amp, 5, sgd, between);
      const GradStreamOutcome early = train_mlp_side(true, true, amp, 5, sgd, between);
      CHECK(early.losses == eager.losses);
      CHECK(early.params == eager.params);
      CHECK(eager.losses.front() != eager.losses.back());
      const std::string kernel = sgd ? "kiln_sgd_step" : "kiln_adam_step";
      CHECK(early.stats.kernel_names_per_graph.at(0).at(kernel) == (between == Between::scale_grads ? 1u : 2u));
      // KILN_EARLY_UPDATES=off: the same bits, every update in one launch after the backward.
      const kiln_test::ScopedEnv off{{"KILN_EARLY_UPDATES", "off"}};
      const GradStreamOutcome late = train_mlp_side(true, true, amp, 5, sgd, between);
      CHECK(late.losses == eager.losses);
      CHECK(late.params == eager.params);
      CHECK(late.stats.kernel_names_per_graph.at(0).at(kernel) == 1u);
    }
}

TEST_CASE("a gradient's ready hook reads it after the second stream wrote it") {
  const GradStreamSwitch on(true);
  Generator gen(8);
  nn::Sequential net(nn::Linear(64, 256, true, &gen), nn::ReLU(), nn::Linear(256, 10, true, &gen));
  net.to(kGpu);
  optim::SGD opt(net.parameters(), {.lr = 0.1});
  Tensor first_weight = net.parameters().front();
  Tensor seen = zeros({256, 64}, {.device = kGpu});
  first_weight.add_grad_ready_hook([&](const Tensor& leaf) { seen.copy_(leaf.grad()); });
  Generator data(4);
  const Tensor x = randn({64, 64}, {}, &data).to(kGpu), y = randint(0, 10, {64}, {}, &data).to(kGpu);
  CompiledFunction cf = compile([&](const std::vector<Tensor>& in) {
    opt.zero_grad();
    Tensor loss = cross_entropy(net(in[0]), in[1]);
    loss.backward();
    return std::vector<Tensor>{loss.detach()};
  });
  for (int i = 0; i < 4; ++i) {
    (void)cf({x, y});
    CHECK(f32_bits(seen) == f32_bits(first_weight.grad()));
    opt.step();  // outside the step: the next gradient differs
  }
  CHECK(cf.stats().replays == 2);
}

TEST_CASE("exact-f32 weight gradients that fill the GPU alone stay on the backward's chain; TF32 ones leave it") {
  const GradStreamSwitch on(true);
  const bool tf32_before = allow_tf32();
  for (const bool tf32 : {false, true}) {
    set_allow_tf32(tf32);
    Generator gen(9);
    // Batch 512: 2^27 and 2^28 multiply-adds, at and over the line.
    nn::Sequential net(nn::Linear(512, 512, true, &gen), nn::Linear(512, 1024, true, &gen));
    net.to(kGpu);
    Generator data(5);
    const Tensor x = randn({512, 512}, {}, &data).to(kGpu);
    CompiledFunction cf = compile([&](const std::vector<Tensor>& in) {
      net.zero_grad();
      Tensor loss = sum(net(in[0]));
      loss.backward();
      return std::vector<Tensor>{loss.detach()};
    });
    for (int i = 0; i < 3; ++i) (void)cf({x});
    const CompileStats s = cf.stats();
    CAPTURE(tf32);
    if (tf32)
      CHECK(s.kernel_chain_per_graph.at(0) < s.kernels_per_graph.at(0));
    else
      CHECK(s.kernel_chain_per_graph.at(0) == s.kernels_per_graph.at(0));
  }
  set_allow_tf32(tf32_before);
}
