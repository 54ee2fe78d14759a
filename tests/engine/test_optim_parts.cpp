// Optimizer::step_in_parts and step_in_spans on the CPU: each part's hook runs before its
// parameters (or their element spans) are updated, in order, the parameters in no part last, and
// the updates are step()'s bit for bit; bad parts are errors that change nothing.
#include <doctest/doctest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "error_message.h"
#include "kiln/kiln.h"

using namespace kiln;
using kiln_test::message_of;

namespace {

// Four f32 parameters of different sizes, the same values in every call.
std::vector<Tensor> make_params() {
  Generator g(21);
  std::vector<Tensor> ps;
  for (std::int64_t n : {5, 3, 8, 2}) {
    Tensor p = randn({n}, {}, &g);
    p.requires_grad_();
    ps.push_back(p);
  }
  return ps;
}

// Gradients that differ from step to step and parameter to parameter.
void set_grads(std::vector<Tensor>& ps, int step) {
  Generator g(100 + static_cast<std::uint64_t>(step));
  for (Tensor& p : ps) p.set_grad(randn(p.shape(), {}, &g));
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

using MakeOpt = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

}  // namespace

const std::vector<std::pair<std::string, MakeOpt>>& optimizer_kinds() {
  static const std::vector<std::pair<std::string, MakeOpt>> kinds = {
      {"SGD",
       [](std::vector<Tensor> p) {
         return std::make_unique<optim::SGD>(std::move(p), optim::SgdOptions{.lr = 0.1, .momentum = 0.9});
       }},
      {"Adam", [](std::vector<Tensor> p) { return std::make_unique<optim::Adam>(std::move(p)); }},
      {"AdamW", [](std::vector<Tensor> p) { return std::make_unique<optim::AdamW>(std::move(p)); }}};
  return kinds;
}

// The two optimizers' parameters and state are the same bits.
void check_same(const optim::Optimizer& a, const std::vector<Tensor>& pa, const optim::Optimizer& b,
                const std::vector<Tensor>& pb) {
  for (std::size_t i = 0; i < pa.size(); ++i) {
    CAPTURE(i);
    CHECK(same_bits(pb[i], pa[i]));
  }
  CHECK(b.steps() == a.steps());
  const nn::NamedTensors sa = a.state(), sb = b.state();
  REQUIRE(sa.size() == sb.size());
  for (std::size_t i = 0; i < sa.size(); ++i) {
    CAPTURE(sa[i].first);
    CHECK(sa[i].first == sb[i].first);
    if (sa[i].second.dtype() == DType::f32) CHECK(same_bits(sa[i].second, sb[i].second));
  }
}

// For each optimizer kind, three steps: step() on one set of parameters, `parted_step` on an
// equal set, then both compared bit for bit, parameters and state (moments included).
void compare_steps(const std::function<void(optim::Optimizer&, std::vector<Tensor>&)>& parted_step) {
  for (const auto& kind : optimizer_kinds()) {
    CAPTURE(kind.first);
    std::vector<Tensor> whole = make_params(), parted = make_params();
    std::unique_ptr<optim::Optimizer> a = kind.second(whole), b = kind.second(parted);
    for (int step = 0; step < 3; ++step) {  // the first makes SGD's momentum buffers
      set_grads(whole, step);
      set_grads(parted, step);
      a->step();
      parted_step(*b, parted);
      check_same(*a, whole, *b, parted);
    }
  }
}

TEST_CASE("optim: step_in_parts updates part by part after each hook, bit for bit as step()") {
  compare_steps([](optim::Optimizer& opt, std::vector<Tensor>& parted) {
    // Parameter 1 is in no part: it is updated after the hooks of both parts.
    std::vector<std::string> events;
    const std::vector<Tensor> before = {parted[0].clone(), parted[1].clone(), parted[2].clone(), parted[3].clone()};
    opt.step_in_parts({{2, 0}, {3}}, [&](std::size_t k) {
      // When part k's hook runs, part k's parameters and the one in no part are not updated yet.
      events.push_back("hook " + std::to_string(k));
      CHECK(same_bits(parted[1], before[1]));
      if (k == 0) CHECK(same_bits(parted[0], before[0]));
      if (k == 1) {
        CHECK(!same_bits(parted[0], before[0]));  // part 0 was updated before part 1's hook
        CHECK(same_bits(parted[3], before[3]));
      }
    });
    CHECK(events == std::vector<std::string>{"hook 0", "hook 1"});
  });
}

TEST_CASE("optim: step_in_spans updates a parameter piece by piece, bit for bit as step()") {
  compare_steps([](optim::Optimizer& opt, std::vector<Tensor>& parted) {
    const Tensor p2 = parted[2].clone();
    std::vector<std::size_t> hooks;
    // Parameter 2 (8 elements) in three spans over two parts; 1 and 3 in no part. An SGD
    // momentum buffer made in this step is new for each of its spans.
    opt.step_in_spans({{{.index = 2, .begin = 5}, {.index = 0}},
                       {{.index = 2, .begin = 0, .count = 2}, {.index = 2, .begin = 2, .count = 3}}},
                      [&](std::size_t k) {
                        hooks.push_back(k);
                        const std::vector<float> now = parted[2].to_vector<float>(), was = p2.to_vector<float>();
                        // Before part 1's hook only elements 5-7 have changed.
                        if (k == 1)
                          for (std::size_t e = 0; e < 8; ++e) CHECK((now[e] != was[e]) == (e >= 5));
                        if (k == 0) CHECK(now == was);
                      });
    CHECK(hooks == std::vector<std::size_t>{0, 1});
  });
}

TEST_CASE("optim: step_in_spans refuses spans that overlap, leave a gap or fall outside, changing nothing") {
  std::vector<Tensor> ps = make_params();
  optim::SGD opt(ps, {.lr = 0.1, .momentum = 0.9});
  set_grads(ps, 0);
  const Tensor p2 = ps[2].clone();
  int hooks = 0;
  auto count = [&](std::size_t) { ++hooks; };
  using Span = optim::ParamSpan;
  CHECK(message_of<ValueError>([&] {
          opt.step_in_spans({{Span{.index = 2, .count = 5}}, {Span{.index = 2, .begin = 4}}}, count);
        }) == "[optim.SGD] step_in_spans: parameter 2: elements [4, 5) are in parts 0 and 1");
  CHECK(message_of<ValueError>([&] {
          opt.step_in_spans({{Span{.index = 2, .count = 3}, Span{.index = 2, .begin = 5}}}, count);
        }) ==
        "[optim.SGD] step_in_spans: parameter 2: elements [3, 5) are in no part; a parameter in a part is "
        "covered whole");
  CHECK(message_of<ValueError>([&] { opt.step_in_spans({{Span{.index = 2, .begin = 6, .count = 3}}}, count); }) ==
        "[optim.SGD] step_in_spans: parameter 2: elements [6, 9) are not a span of its 8 elements");
  CHECK(message_of<ValueError>([&] { opt.step_in_spans({{Span{.index = 2, .begin = 8}}}, count); }) ==
        "[optim.SGD] step_in_spans: parameter 2: elements [8, 8) are not a span of its 8 elements");
  CHECK(message_of<ValueError>([&] { opt.step_in_spans({{Span{.index = 7}}}, count); }) ==
        "[optim.SGD] step_in_spans: parameter 7 is out of range (4 parameters)");
  CHECK(hooks == 0);
  CHECK(opt.steps() == 0);
  CHECK(same_bits(ps[2], p2));
  CHECK(opt.state().size() == 1);  // "step" alone: no momentum buffer was made
}

TEST_CASE("optim: step_in_parts refuses an index out of range or in two parts, changing nothing") {
  std::vector<Tensor> ps = make_params();
  optim::Adam opt(ps);
  set_grads(ps, 0);
  const Tensor p0 = ps[0].clone();
  int hooks = 0;
  auto count = [&](std::size_t) { ++hooks; };
  CHECK(message_of<ValueError>([&] {
          opt.step_in_parts({{0}, {4}}, count);
        }) == "[optim.Adam] step_in_parts: parameter 4 is out of range (4 parameters)");
  CHECK(message_of<ValueError>([&] {
          opt.step_in_parts({{0, 1}, {2, 1}}, count);
        }) == "[optim.Adam] step_in_parts: parameter 1 is in parts 0 and 1");
  CHECK(hooks == 0);
  CHECK(opt.steps() == 0);
  CHECK(same_bits(ps[0], p0));
  // Empty parts and no hook: step().
  set_grads(ps, 0);
  opt.step_in_parts({{}, {}}, nullptr);
  CHECK(opt.steps() == 1);
  CHECK(!same_bits(ps[0], p0));
}
