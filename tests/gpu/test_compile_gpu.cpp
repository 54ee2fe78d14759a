// Compiled steps on the GPU: a captured and replayed training step computes bit for bit what
// the same step computes eagerly, and signatures, eviction, failures and memory behave.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../../examples/mnist/models.h"
#include "conv_tf32.h"
#include "error_message.h"
#include "gpu_match.h"
#include "kiln/kiln.h"
#include "kiln/runtime/graph.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/memory.h"
#include "kiln/runtime/module_cache.h"
#include "programmatic_launch.h"

using namespace kiln;

namespace {

using kiln_test::kGpu;

struct Config {
  std::string model, optimizer, schedule;
  bool dropout = false;
};

// A model, its optimizer and schedule, from fixed seeds.
struct CompiledTrainer {
  std::shared_ptr<nn::Sequential> net;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<optim::LrScheduler> sched;
  Generator drop_gen{99};

  explicit CompiledTrainer(const Config& c) {
    Generator gen(11);
    if (c.dropout) {
      net = std::make_shared<nn::Sequential>(nn::Flatten(), nn::Linear(784, 256, true, &gen), nn::ReLU(),
                                             nn::Dropout(0.25, &drop_gen), nn::Linear(256, 128, true, &gen), nn::ReLU(),
                                             nn::Dropout(0.1), nn::Linear(128, 10, true, &gen));
    } else {
      net = mnist::make_model(c.model, gen);
    }
    net->to(kGpu);
    if (c.optimizer == "sgd") opt = std::make_unique<optim::SGD>(net->parameters(), optim::SgdOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true, .weight_decay = 1e-4});
    else if (c.optimizer == "adamw") opt = std::make_unique<optim::AdamW>(net->parameters(), optim::AdamOptions{.lr = 2e-3, .weight_decay = 0.01});
    else opt = std::make_unique<optim::Adam>(net->parameters(), optim::AdamOptions{.lr = 1e-3});
    if (c.schedule == "cosine") sched = std::make_unique<optim::CosineLR>(*opt, 1e-3, 10);
    else if (c.schedule == "onecycle") sched = std::make_unique<optim::OneCycleLR>(*opt, 4e-3, 10);
    else if (c.schedule == "step") sched = std::make_unique<optim::StepLR>(*opt, 0.05, 2, 0.5);
  }

  std::vector<Tensor> step(const std::vector<Tensor>& in) {
    opt->zero_grad();
    Tensor loss = cross_entropy((*net)(in[0]), in[1]);
    loss.backward();
    opt->step();
    if (sched) sched->step();
    return {loss};
  }
};

std::vector<std::pair<Tensor, Tensor>> batches(int count, std::int64_t batch) {
  Generator g(5);
  std::vector<std::pair<Tensor, Tensor>> out;
  for (int i = 0; i < count; ++i)
    out.emplace_back(randn({batch, 1, 28, 28}, {}, &g).to(kGpu), randint(0, 10, {batch}, {}, &g).to(kGpu));
  return out;
}

using kiln_test::f32_bits;

struct StepOutcome {
  std::vector<std::uint32_t> losses;
  std::vector<std::vector<std::uint32_t>> params{};
  std::int64_t steps = 0;
  double lr = 0;
};

StepOutcome finish(CompiledTrainer& t, std::vector<std::uint32_t> losses) {
  StepOutcome o{std::move(losses)};
  for (const Tensor& p : t.net->parameters()) o.params.push_back(f32_bits(p));
  o.steps = t.opt->steps();
  o.lr = t.opt->lr();
  return o;
}

StepOutcome run(const Config& c, int steps, bool compiled, CompileStats* stats = nullptr, bool fuse = false) {
  manual_seed(1234);  // the second dropout draws from the default generator
  CompiledTrainer t(c);
  const auto data = batches(3, 32);
  std::vector<std::uint32_t> losses;
  CompiledFunction cf = compile([&](const std::vector<Tensor>& in) { return t.step(in); }, {.fuse = fuse});
  for (int i = 0; i < steps; ++i) {
    const auto& [x, y] = data[static_cast<std::size_t>(i) % data.size()];
    const Tensor loss = compiled ? cf({x, y})[0] : t.step({x, y})[0];
    losses.push_back(f32_bits(loss)[0]);
  }
  if (stats) *stats = cf.stats();
  return finish(t, std::move(losses));
}

}  // namespace

TEST_CASE("a compiled training step is bit-identical to eager: mlp and cnn, Adam, AdamW and SGD, schedules, dropout") {
  const std::vector<Config> configs{{"mlp", "adam", "cosine"},
                                    {"mlp", "adamw", "onecycle", true},
                                    {"cnn", "sgd", "step"},
                                    {"cnn", "adamw", "none"}};
  for (const Config& c : configs) {
    const std::string name = c.model + "/" + c.optimizer + "/" + c.schedule + (c.dropout ? "/dropout" : "");
    CAPTURE(name);
    constexpr int kSteps = 7;
    CompileStats stats;
    const StepOutcome eager = run(c, kSteps, false);
    const StepOutcome compiled = run(c, kSteps, true, &stats);
    CHECK(stats.eager_calls == 1);
    CHECK(stats.captures == 1);
    CHECK(stats.replays == kSteps - 2);
    REQUIRE(stats.kernels_per_graph.size() == 1);
    CHECK(stats.kernels_per_graph[0] > 10);
    REQUIRE(stats.kernel_names_per_graph.size() == 1);
    std::size_t named = 0;
    for (const auto& entry : stats.kernel_names_per_graph[0]) named += entry.second;
    CHECK(named == stats.kernels_per_graph[0]);
    // The optimizer's step words ride on the input copy; a generator's state, in the capture's
    // own memory, keeps its store.
    CHECK((stats.kernel_names_per_graph[0].count("kiln_store_words") > 0) == c.dropout);
    // Every parameter is f32: one multi-tensor update, in two launches with the second stream
    // (the parameters ready before the last layer's update beside its backward).
    const std::string update = c.optimizer == "sgd" ? "kiln_sgd_step" : "kiln_adam_step";
    CHECK(stats.kernel_names_per_graph[0].count(update) == 1);
    if (stats.kernel_names_per_graph[0].count(update))
      CHECK(stats.kernel_names_per_graph[0].at(update) == (weight_grad_stream() ? 2u : 1u));
    CHECK(compiled.steps == kSteps);  // host state advanced at every replay
    CHECK(compiled.lr == eager.lr);
    CHECK(compiled.losses == eager.losses);
    CHECK(eager.losses.front() != eager.losses.back());  // it trains
    REQUIRE(compiled.params.size() == eager.params.size());
    for (std::size_t i = 0; i < eager.params.size(); ++i) {
      CAPTURE(i);
      CHECK(compiled.params[i] == eager.params[i]);
    }
  }
}

// Fusion rounds where the single ops round, so fused steps (the default) are eager's bits.
TEST_CASE("fused training steps give eager's losses and parameters bit for bit") {
  const kiln_test::ConvTF32 exact(false);  // f32 rounding is the subject, not TF32's
  const std::vector<Config> configs{{"mlp", "adam", "cosine"}, {"mlp", "adamw", "onecycle", true}, {"cnn", "sgd", "step"},
                                    {"cnn", "adamw", "none"}};
  for (const Config& c : configs) {
    const std::string name = c.model + "/" + c.optimizer + "/" + c.schedule + (c.dropout ? "/dropout" : "");
    CAPTURE(name);
    CompileStats stats;
    const StepOutcome eager = run(c, 7, false);
    const StepOutcome fused = run(c, 7, true, &stats, true);
    std::size_t first_loss = eager.losses.size(), differing = 0;
    for (std::size_t i = 0; i < eager.losses.size(); ++i)
      if (fused.losses[i] != eager.losses[i] && first_loss == eager.losses.size()) first_loss = i;
    double worst = 0;
    for (std::size_t i = 0; i < eager.params.size(); ++i)
      for (std::size_t j = 0; j < eager.params[i].size(); ++j) {
        float a = 0, b = 0;
        std::memcpy(&a, &eager.params[i][j], 4);
        std::memcpy(&b, &fused.params[i][j], 4);
        if (a != b) ++differing;
        worst = std::max(worst, static_cast<double>(std::abs(a - b)) / (1e-3 + std::abs(a)));
      }
    MESSAGE(name << ": fused graph " << stats.kernels_per_graph.at(0) << " kernels; first differing loss at step "
                 << first_loss << " of 7; " << differing << " parameter elements differ, worst relative " << worst);
    CHECK(first_loss == eager.losses.size());
    CHECK(differing == 0);
  }
}

TEST_CASE("compiled training steps give the same bits with programmatic launch on and off") {
  for (const Config& c : {Config{"mlp", "adam", "cosine"}, Config{"cnn", "adamw", "none"}}) {
    CAPTURE(c.model);
    CompileStats on_stats, off_stats;
    auto run_with = [&](bool on, CompileStats* stats) {
      const kiln_test::ProgrammaticLaunch scope(on);
      return run(c, 5, true, stats, true);
    };
    const StepOutcome off = run_with(false, &off_stats);
    const StepOutcome on = run_with(true, &on_stats);
    CHECK(on.losses == off.losses);
    CHECK(on.params == off.params);
    CHECK(off_stats.programmatic_edges_per_graph.at(0) == 0);
    MESSAGE(c.model << ": " << on_stats.programmatic_edges_per_graph.at(0) << " programmatic edges among "
                    << on_stats.kernels_per_graph.at(0) << " kernels");
    if (kiln_test::launches_early()) CHECK(on_stats.programmatic_edges_per_graph.at(0) > 0);
  }
}

namespace {

// A stateless function: its compiled results can be checked against eager calls.
std::vector<Tensor> affine_relu(const Tensor& w, const std::vector<Tensor>& in) {
  return {relu(add(matmul(in[0], w), 1.5)), sum(in[0])};
}

void check_same(const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(f32_bits(got[i]) == f32_bits(want[i]));
}

}  // namespace

TEST_CASE("compile: weights put back, reset_state and a schedule reset make the replays repeat the first run") {
  CompiledTrainer t({"cnn", "adam", "onecycle"});
  std::vector<Tensor> start;
  for (const Tensor& p : t.net->parameters()) start.push_back(p.detach().clone());
  const auto data = batches(3, 32);
  CompiledFunction cf = compile([&](const std::vector<Tensor>& in) { return t.step(in); });
  auto five_steps = [&] {
    std::vector<std::uint32_t> losses;
    for (int i = 0; i < 5; ++i) {
      const auto& xy = data[static_cast<std::size_t>(i) % data.size()];
      losses.push_back(f32_bits(cf({xy.first, xy.second})[0])[0]);
    }
    return finish(t, std::move(losses));
  };
  const StepOutcome first = five_steps();  // the eager call, the capture, three replays
  {
    NoGradGuard no_grad;
    const std::vector<Tensor> params = t.net->parameters();
    for (std::size_t i = 0; i < params.size(); ++i) params[i].detach().copy_(start[i]);
  }
  t.opt->reset_state();
  t.sched->reset();
  const StepOutcome again = five_steps();  // replays only
  CHECK(cf.stats().captures == 1);
  CHECK(cf.stats().replays == 8);
  CHECK(again.losses == first.losses);
  CHECK(again.params == first.params);
  CHECK(again.steps == 5);
  CHECK(again.lr == first.lr);
  // Resetting host state inside a capture would not be replayed: refused.
  CompiledFunction bad = compile([&](const std::vector<Tensor>& in) {
    t.opt->reset_state();
    return t.step(in);
  });
  bad({data[0].first, data[0].second});
  CHECK_THROWS_AS(bad({data[0].first, data[0].second}), ValueError);
}

TEST_CASE("compile: a signature change captures once more, then both signatures replay") {
  Generator g(3);
  const Tensor w = randn({16, 8}, {}, &g).to(kGpu);
  auto fn = [&](const std::vector<Tensor>& in) { return affine_relu(w, in); };
  CompiledFunction cf = compile(fn);
  for (int round = 0; round < 2; ++round) {
    for (std::int64_t batch : {32, 32, 32, 5, 5, 5, 32}) {
      const Tensor x = randn({batch, 16}, {}, &g).to(kGpu);
      check_same(cf({x}), fn({x}));  // new data every call reaches the graph
    }
  }
  const CompileStats s = cf.stats();
  CHECK(s.captures == 2);
  CHECK(s.eager_calls == 2);
  CHECK(s.replays == 14 - 4);
  CHECK(s.graphs == 2);
  CHECK(s.evictions == 0);
  // A non-contiguous input is copied in as its contiguous values (eager cuBLAS would read the
  // transposed layout directly and may round differently).
  const Tensor xt_base = randn({16, 32}, {}, &g).to(kGpu);
  const Tensor xt = transpose(xt_base, 0, 1);
  check_same(cf({xt}), fn({xt.contiguous()}));
}

TEST_CASE("compile: outputs live in static buffers that the next call overwrites") {
  Generator g(4);
  const Tensor w = randn({16, 8}, {}, &g).to(kGpu);
  CompiledFunction cf = compile([&](const std::vector<Tensor>& in) { return affine_relu(w, in); });
  const Tensor a = randn({4, 16}, {}, &g).to(kGpu), b = randn({4, 16}, {}, &g).to(kGpu);
  cf({a});
  const Tensor first = cf({a})[0];  // captured
  const std::vector<std::uint32_t> kept = f32_bits(first.clone());
  const Tensor second = cf({b})[0];  // replayed into the same buffer
  CHECK(first.data_ptr() == second.data_ptr());
  CHECK(f32_bits(first) == f32_bits(second));
  CHECK(f32_bits(second) != kept);
  CHECK_FALSE(second.requires_grad());
}

TEST_CASE("compile: the least recently used graph is evicted") {
  Generator g(6);
  const Tensor w = randn({16, 8}, {}, &g).to(kGpu);
  auto fn = [&](const std::vector<Tensor>& in) { return affine_relu(w, in); };
  CompiledFunction cf = compile(fn, {.max_graphs = 2});
  auto call = [&](std::int64_t batch) {
    const Tensor x = randn({batch, 16}, {}, &g).to(kGpu);
    check_same(cf({x}), fn({x}));
  };
  for (std::int64_t b : {1, 1, 2, 2, 1}) call(b);  // two graphs, 1 used last
  CHECK(cf.stats().graphs == 2);
  call(3);  // evicts 2
  CHECK(cf.stats().evictions == 1);
  call(3);
  call(1);  // still captured: a replay
  CHECK(cf.stats().captures == 3);
  call(2);  // evicted: eager again, evicting 3
  call(2);
  CHECK(cf.stats().captures == 4);
  CHECK(cf.stats().evictions == 2);
  CHECK(cf.stats().graphs == 2);
}

TEST_CASE("compile: what needs the host throws inside a capture and leaves the engine usable") {
  Generator g(7);
  const Tensor x = randn({8, 8}, {}, &g).to(kGpu);
  const rt::KernelSpec* unloaded = [] {
    rt::KernelSpec s;
    s.op = "test_never_loaded";
    s.template_name = "step_io";
    s.entry = "kiln_store_words";
    s.dtypes = {DTypes{DType::u8}};
    s.bind = [](const DTypes&, std::uint32_t) { return rt::Bindings{}; };
    return &rt::register_kernel(std::move(s));
  }();
  struct Case {
    const char* name;
    const char* message;
    std::function<void(const Tensor&)> misuse;
  };
  const std::vector<Case> cases{
      {"item", "[item]", [](const Tensor& t) { (void)sum(t).item<float>(); }},
      {"to cpu", "[to]", [](const Tensor& t) { (void)t.to(Device::cpu()); }},
      {"from host data", "[from_data]", [](const Tensor&) { (void)from_vector<float>({1, 2}, {2}, {.device = kGpu}); }},
      {"op on a cpu tensor", "runs on a CPU tensor inside a step captured on cuda:0", [](const Tensor&) { (void)add(ones({2}), ones({2})); }},
      {"kernel not loaded", "was not loaded before the capture",
       [&](const Tensor&) { (void)rt::get_function(*unloaded, DTypes{DType::u8}, 0, 0); }},
  };
  const std::size_t private_before = rt::pool_usage(0).private_bytes;
  for (const Case& c : cases) {
    CAPTURE(c.name);
    int calls = 0;
    CompiledFunction cf = compile([&](const std::vector<Tensor>& in) {
      Tensor y = mul(in[0], 2.0);
      if (calls++ == 1) c.misuse(y);  // the second (capturing) call only
      return std::vector<Tensor>{y};
    });
    cf({x});
    const std::string msg = kiln_test::message_of<ValueError>([&] { cf({x}); });
    CHECK(msg.find(c.message) != std::string::npos);
    CHECK_FALSE(rt::thread_capturing());
    CHECK_FALSE(capturing());
    CHECK(cf.stats().captures == 0);
    // The next eager work runs and reads back.
    CHECK(f32_bits(add(x, 1.0)) == f32_bits(add(x, 1.0).to(Device::cpu()).to(kGpu)));
    CHECK(rt::pool_usage(0).private_bytes == private_before);
  }
}

TEST_CASE("compile: destroying a compiled function returns its memory; two can be alive at once") {
  CompiledTrainer t({"mlp", "adam", "none"});
  const auto data = batches(2, 64);
  t.step({data[0].first, data[0].second});  // gradients and optimizer state exist before measuring
  const rt::PoolUsage before = rt::pool_usage(0);
  {
    CompiledFunction train = compile([&](const std::vector<Tensor>& in) { return t.step(in); });
    CompiledFunction eval = compile([&](const std::vector<Tensor>& in) {
      NoGradGuard no_grad;
      return std::vector<Tensor>{argmax((*t.net)(in[0]), 1)};
    });
    for (int i = 0; i < 4; ++i) {
      const auto& [x, y] = data[static_cast<std::size_t>(i % 2)];
      const Tensor loss = train({x, y})[0];
      const Tensor pred = eval({x})[0];
      NoGradGuard no_grad;
      CHECK(f32_bits(pred) == f32_bits(argmax((*t.net)(x), 1)));  // the eval graph sees the trained weights
      CHECK(std::isfinite(loss.item<float>()));
    }
    CHECK(train.stats().replays == 2);
    CHECK(eval.stats().replays == 2);
    CHECK(train.stats().bytes_held > 0);
    CHECK(rt::pool_usage(0).private_bytes > before.private_bytes);
  }
  const rt::PoolUsage after = rt::pool_usage(0);
  CHECK(after.private_bytes == before.private_bytes);
  CHECK(after.used - after.cached == before.used - before.cached);
}

TEST_CASE("compile: inference under NoGradGuard is its own signature and matches eager") {
  Generator g(8);
  auto net = mnist::make_model("cnn", g);
  net->to(kGpu);
  net->eval();
  auto fn = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{(*net)(in[0])}; };
  CompiledFunction cf = compile(fn, {.key = [&] { return std::string(net->is_training() ? "train" : "eval"); }});
  const Tensor x = randn({16, 1, 28, 28}, {}, &g).to(kGpu);
  for (int i = 0; i < 3; ++i) {
    NoGradGuard no_grad;
    const std::vector<Tensor> got = cf({x});
    check_same(got, fn({x}));
  }
  cf({x});  // grad mode on: another signature
  CHECK(cf.stats().eager_calls == 2);
  CHECK(cf.stats().captures == 1);
}

TEST_CASE("fused compiled steps in f64 agree with eager to 1e-12") {
  // A hand-built f64 mlp: fused linear+ReLU, a pointwise chain that fusion groups, the fused
  // cross-entropy. Each step's loss and gradients agree to 1e-12 (relative to the largest
  // element); parameters after 6 Adam steps are reported (Adam's normalisation amplifies).
  auto params = [] {
    Generator g(3);
    std::vector<Tensor> p{mul(randn({64, 784}, {.dtype = DType::f64}, &g), 0.05), zeros({64}, {.dtype = DType::f64}),
                          mul(randn({10, 64}, {.dtype = DType::f64}, &g), 0.1), zeros({10}, {.dtype = DType::f64})};
    for (Tensor& t : p) t = t.to(kGpu).detach().requires_grad_();
    return p;
  };
  struct Trace {
    std::vector<double> losses;
    std::vector<std::vector<std::vector<double>>> grads;  // per step, per parameter
    std::vector<std::vector<double>> params;
  };
  auto host = [](const Tensor& t) { return t.to(Device::cpu()).to_vector<double>(); };
  auto train = [&](std::vector<Tensor> p, bool compiled) {
    optim::Adam opt(p, {.lr = 1e-2});
    auto step = [&](const std::vector<Tensor>& in) {
      opt.zero_grad();
      Tensor h = linear(in[0], p[0], p[1], Activation::relu);
      h = add(mul(tanh(h), 0.5), mul(h, 0.25));
      Tensor loss = cross_entropy(linear(h, p[2], p[3]), in[1]);
      loss.backward();
      opt.step();
      return std::vector<Tensor>{loss.detach()};
    };
    CompiledFunction cf = compile(step, {.fuse = true});
    Generator g(8);
    const Tensor x = randn({32, 784}, {.dtype = DType::f64}, &g).to(kGpu), y = randint(0, 10, {32}, {}, &g).to(kGpu);
    Trace t;
    for (int i = 0; i < 6; ++i) {
      t.losses.push_back((compiled ? cf({x, y}) : step({x, y}))[0].item<double>());
      t.grads.emplace_back();
      for (const Tensor& q : p) t.grads.back().push_back(host(q.grad()));
    }
    for (const Tensor& q : p) t.params.push_back(host(q));
    return t;
  };
  // max |a - b| over max |a|
  auto gap = [](const std::vector<double>& a, const std::vector<double>& b) {
    double diff = 0, scale = 0;
    for (std::size_t j = 0; j < a.size(); ++j) {
      diff = std::max(diff, std::abs(a[j] - b[j]));
      scale = std::max(scale, std::abs(a[j]));
    }
    return diff / std::max(scale, 1e-300);
  };
  const Trace eager = train(params(), false), fused = train(params(), true);
  double worst_grad = 0, worst_param = 0;
  for (std::size_t i = 0; i < eager.losses.size(); ++i) {
    CHECK(std::abs(eager.losses[i] - fused.losses[i]) <= 1e-12 * std::abs(eager.losses[i]));
    for (std::size_t k = 0; k < eager.grads[i].size(); ++k)
      worst_grad = std::max(worst_grad, gap(eager.grads[i][k], fused.grads[i][k]));
  }
  for (std::size_t k = 0; k < eager.params.size(); ++k) worst_param = std::max(worst_param, gap(eager.params[k], fused.params[k]));
  MESSAGE("f64 fused compiled vs eager: gradients within " << worst_grad << ", parameters after 6 Adam steps within "
                                                           << worst_param << " (relative to the largest element)");
  CHECK(worst_grad <= 1e-12);
  CHECK(worst_param <= 1e-12);
}

TEST_CASE("compile: a strided input runs eagerly on the layout the capture sees") {
  // The capture reads contiguous static buffers; an eager call on the strided input itself
  // would load only the strided kernel variant and the capture would then miss one.
  Generator g(21);
  const Tensor xt = transpose(randn({17, 33}, {}, &g).to(kGpu), 0, 1);
  REQUIRE(!xt.is_contiguous());
  CompiledFunction cf = compile([](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{pointwise("strided_input_probe", "x * 3 + 1", {in[0]})};
  });
  const std::vector<std::uint32_t> want = f32_bits(pointwise("strided_input_probe", "x * 3 + 1", {xt}));
  for (int i = 0; i < 3; ++i) CHECK(f32_bits(cf({xt})[0]) == want);  // eager, capture, replay
  CHECK(cf.stats().captures == 1);
}

TEST_CASE("compile: gradients of a fused compiled step against finite differences in f64") {
  Generator g(17);
  std::vector<Tensor> p{mul(randn({8, 12}, {.dtype = DType::f64}, &g), 0.3), mul(randn({8}, {.dtype = DType::f64}, &g), 0.1),
                        mul(randn({3, 8}, {.dtype = DType::f64}, &g), 0.3), mul(randn({3}, {.dtype = DType::f64}, &g), 0.1)};
  for (Tensor& t : p) t = t.to(kGpu).detach().requires_grad_();
  const Tensor x = randn({5, 12}, {.dtype = DType::f64}, &g).to(kGpu), y = randint(0, 3, {5}, {}, &g).to(kGpu);
  auto loss_of = [&](const std::vector<Tensor>& q, const Tensor& in) {
    Tensor h = linear(in, q[0], q[1], Activation::relu);
    h = add(mul(tanh(h), 0.5), mul(sigmoid(h), h));  // a chain fusion groups
    return cross_entropy(linear(h, q[2], q[3]), y, Reduction::mean, 0.1);
  };
  CompiledFunction step = compile(
      [&](const std::vector<Tensor>& in) {
        for (Tensor& t : p) t.zero_grad();
        loss_of(p, in[0]).backward();
        std::vector<Tensor> grads;
        for (const Tensor& t : p) grads.push_back(mul(t.grad(), 1.0));
        return grads;
      },
      {.fuse = true});
  std::vector<Tensor> grads;
  for (int i = 0; i < 3; ++i) grads = step({x});  // eager, capture, replay
  REQUIRE(step.stats().replays == 1);
  NoGradGuard no_grad;
  const double eps = 1e-6;
  double worst = 0;
  for (std::size_t k = 0; k < p.size(); ++k) {
    const std::vector<double> analytic = grads[k].to(Device::cpu()).to_vector<double>();
    std::vector<double> values = p[k].to(Device::cpu()).to_vector<double>();
    for (std::size_t j = 0; j < values.size(); ++j) {
      std::vector<Tensor> q = p;
      auto at = [&](double v) {
        std::vector<double> moved = values;
        moved[j] = v;
        q[k] = from_vector(moved, p[k].shape()).to(kGpu);
        return loss_of(q, x).item<double>();
      };
      const double numeric = (at(values[j] + eps) - at(values[j] - eps)) / (2 * eps);
      worst = std::max(worst, std::abs(numeric - analytic[j]) / (1e-6 + std::abs(numeric)));
    }
  }
  MESSAGE("compiled f64 gradients vs central differences: worst relative error " << worst);
  CHECK(worst < 1e-5);
}

TEST_CASE("compile: a step without inputs stores the optimizer's words with a kernel of its own") {
  auto train = [](bool compiled) {
    Generator g(4);
    Tensor p = randn({40}, {}, &g).to(kGpu).detach().requires_grad_();
    optim::Adam opt({p}, {.lr = 1e-2});
    auto step = [&](const std::vector<Tensor>&) {
      opt.zero_grad();
      Tensor loss = sum(mul(p, p));
      loss.backward();
      opt.step();
      return std::vector<Tensor>{loss.detach()};
    };
    CompiledFunction cf = compile(step, {.device = kGpu});
    for (int i = 0; i < 5; ++i) (void)(compiled ? cf({}) : step({}));
    return std::pair{f32_bits(p.detach()), cf.stats()};
  };
  const auto [eager, unused] = train(false);
  const auto [compiled, stats] = train(true);
  CHECK(compiled == eager);  // the bias corrections of every step reached the update
  REQUIRE(stats.kernel_names_per_graph.size() == 1);
  CHECK(stats.kernel_names_per_graph[0].count("kiln_store_words") == 1);
  CHECK(stats.kernel_names_per_graph[0].count("kiln_copy_inputs") == 0);
}
