// A compiled step's convs: their weight gradients' split rows are summed by the update's own
// kernel (Adam's, AdamW's or SGD's, also for a step skipped on a device flag) instead of the
// small kind's reduce, one launch fewer each, and every loss, parameter and gradient keeps
// eager's bits; a ready hook or a step in parts (whose before() may read the gradient) sum them
// as before.
#include <doctest/doctest.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpu_match.h"
#include "kiln/kiln.h"
#include "kiln/runtime/tuning.h"

using namespace kiln;

namespace {

using kiln_test::f32_bits;
using kiln_test::kGpu;

// The heuristics' picks: the small kind leads these weight gradients (few taps, bf16), not a
// choice another test stored.
struct HeldSumsHeuristics {
  rt::TuneMode was = rt::tune_mode();
  HeldSumsHeuristics() { rt::set_tune_mode(rt::TuneMode::off); }
  ~HeldSumsHeuristics() { rt::set_tune_mode(was); }
};

enum class Update { adam, adamw, sgd, skipped, hooked, parts };

struct HeldSumsRun {
  std::vector<std::uint32_t> losses, read_sums;  // read_sums: Update::parts's reads of the conv's gradient
  std::vector<std::vector<std::uint32_t>> params, grads;
  std::map<std::string, std::size_t> kernels;  // the graph's, by name (compiled only)
};

// conv (1 -> 8 channels, 5 x 5) -> ReLU -> 2 x 2 max pool -> conv (8 -> 16, 3 x 3) -> ReLU -> 2 x 2
// max pool -> linear, trained for `steps` steps on fixed batches under autocast to bf16 (the
// weight gradients of bf16 operands written in f32). The second conv's gradient is final before
// the backward's end (its update may run beside the first conv's weight gradient); the first's
// is the last.
HeldSumsRun train(bool compiled, Update update, int steps = 4) {
  Generator gen(7);
  nn::Sequential net(nn::Conv2d(1, 8, {5, 5}, {.padding = {2}}, false, &gen), nn::ReLU(), nn::MaxPool2d({2, 2}),
                     nn::Conv2d(8, 16, {3, 3}, {}, false, &gen), nn::ReLU(), nn::MaxPool2d({2, 2}), nn::Flatten(),
                     nn::Linear(16 * 6 * 6, 10, true, &gen));
  net.to(kGpu);
  std::unique_ptr<optim::Optimizer> opt;
  if (update == Update::sgd)
    opt = std::make_unique<optim::SGD>(net.parameters(), optim::SgdOptions{.lr = 0.05, .momentum = 0.9});
  else if (update == Update::adamw)
    opt = std::make_unique<optim::AdamW>(net.parameters(), optim::AdamOptions{.lr = 1e-3, .weight_decay = 0.05});
  else
    opt = std::make_unique<optim::Adam>(net.parameters(), optim::AdamOptions{.lr = 1e-3});
  Tensor conv_weight = net.parameters()[0];
  int hook_calls = 0;
  if (update == Update::hooked) conv_weight.add_grad_ready_hook([&](const Tensor&) { ++hook_calls; });
  // Skipped steps: the flag is set, so nothing changes but the gradients.
  const Tensor skip = full({1}, update == Update::skipped ? 1.0 : 0.0, {.dtype = DType::f32, .device = kGpu});
  Generator data(3);
  const Tensor x = randn({64, 1, 28, 28}, {}, &data).to(kGpu);
  const Tensor y = randint(0, 10, {64}, {}, &data).to(kGpu);
  StepFunction fn = [&](const std::vector<Tensor>& in) {
    opt->zero_grad();
    Tensor loss;
    {
      AutocastGuard guard(DType::bf16);
      loss = cross_entropy(net(in[0]), in[1]);
    }
    loss.backward();
    Tensor read;
    if (update == Update::skipped)
      opt->step_unless(skip);
    else if (update == Update::parts)
      opt->step_in_parts({{0}}, [&](std::size_t) { read = sum(conv_weight.grad()); });
    else
      opt->step();
    if (read.defined()) return std::vector<Tensor>{loss.detach(), read};
    return std::vector<Tensor>{loss.detach()};
  };
  CompiledFunction cf = compile(fn);
  HeldSumsRun o;
  for (int i = 0; i < steps; ++i) {
    const std::vector<Tensor> out = compiled ? cf({x, y}) : fn({x, y});
    o.losses.push_back(f32_bits(out[0])[0]);
    if (out.size() > 1) o.read_sums.push_back(f32_bits(out[1])[0]);
  }
  for (const Tensor& p : net.parameters()) {
    o.params.push_back(f32_bits(p));
    o.grads.push_back(f32_bits(p.grad()));
  }
  if (compiled) {
    REQUIRE(cf.stats().kernel_names_per_graph.size() == 1);
    o.kernels = cf.stats().kernel_names_per_graph[0];
  }
  if (update == Update::hooked) CHECK(hook_calls > 0);  // replays run no host code
  return o;
}

std::size_t count(const HeldSumsRun& o, const std::string& kernel) {
  const auto it = o.kernels.find(kernel);
  return it == o.kernels.end() ? 0 : it->second;
}

// Every loss, parameter and gradient, bit for bit.
void check_same_bits(const HeldSumsRun& compiled, const HeldSumsRun& eager) {
  CHECK(compiled.losses == eager.losses);
  CHECK(compiled.params == eager.params);
  CHECK(compiled.grads == eager.grads);
  CHECK(compiled.read_sums == eager.read_sums);
}

}  // namespace

TEST_CASE("a compiled step's update sums its convs' weight-gradient rows: a launch fewer each, eager's bits") {
  const HeldSumsHeuristics heuristics;
  for (const Update update : {Update::adam, Update::adamw, Update::sgd, Update::skipped}) {
    const std::string name = update == Update::adamw     ? "AdamW"
                             : update == Update::sgd     ? "SGD"
                             : update == Update::skipped ? "Adam, skipped on a device flag"
                                                         : "Adam";
    CAPTURE(name);
    const HeldSumsRun eager = train(false, update);
    const HeldSumsRun compiled = train(true, update);
    check_same_bits(compiled, eager);
    // Skipped steps change no parameter, but still write the summed gradients.
    if (update == Update::skipped)
      CHECK(eager.losses.front() == eager.losses.back());
    else
      CHECK(eager.losses.front() != eager.losses.back());
    // Both convs ran the small kind (its first kernel), and no reduce: the updates made the sums.
    CHECK(count(compiled, "kiln_conv_wgrad_small") == 2);
    CHECK(count(compiled, "kiln_conv_wgrad_small_reduce") == 0);
    // Two launches: the parameters final before the backward's last kernels beside them, then
    // the first conv's weight; a skipped step updates after the backward, in one.
    const std::string kernel = update == Update::sgd ? "kiln_sgd_step" : "kiln_adam_step";
    CHECK(count(compiled, kernel) == (update == Update::skipped ? 1 : 2));
  }
}

TEST_CASE("held weight-gradient rows are summed apart where a hook or a part's before() reads the gradient") {
  const HeldSumsHeuristics heuristics;
  for (const Update update : {Update::hooked, Update::parts}) {
    const std::string name =
        update == Update::hooked ? "a ready hook on the first conv's weight" : "in parts, before() reading it";
    CAPTURE(name);
    const HeldSumsRun eager = train(false, update);
    const HeldSumsRun compiled = train(true, update);
    check_same_bits(compiled, eager);
    CHECK(eager.losses.front() != eager.losses.back());
    CHECK(count(compiled, "kiln_conv_wgrad_small") == 2);
    // The hooked gradient's reduce runs; the other conv's rows reach its update. In parts, both.
    CHECK(count(compiled, "kiln_conv_wgrad_small_reduce") == (update == Update::hooked ? 1 : 2));
  }
}
