// kiln::compile on the CPU: every call runs eagerly with the same results, options are
// checked, and a compiled call keeps gradients in their buffers.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "error_message.h"
#include "kiln/kiln.h"

using namespace kiln;

TEST_CASE("compile: bad options and functions are ValueErrors naming compile") {
  auto fn = [](const std::vector<Tensor>& in) { return in; };
  CHECK(kiln_test::message_of<ValueError>([] { compile(StepFunction()); }).find("[compile]") == 0);
  CHECK(kiln_test::message_of<ValueError>([&] { compile(fn, {.max_graphs = 0}); }).find("max_graphs") != std::string::npos);
  CHECK(kiln_test::message_of<ValueError>([&] { compile(fn, {.warmup_calls = 0}); }).find("warmup_calls") !=
        std::string::npos);
  CompiledFunction cf = compile(fn);
  CHECK(kiln_test::message_of<ValueError>([&] { cf({Tensor()}); }).find("input 0 is an undefined tensor") !=
        std::string::npos);
  CompiledFunction outer = compile([&](const std::vector<Tensor>& in) { return cf(in); });
  CHECK(kiln_test::message_of<ValueError>([&] { outer({ones({2})}); }).find("cannot call a compiled function") !=
        std::string::npos);
}

TEST_CASE("compile on the CPU runs the function eagerly every call") {
  int calls = 0;
  CompiledFunction cf = compile([&](const std::vector<Tensor>& in) {
    ++calls;
    CHECK(in_compiled_call());
    CHECK_FALSE(capturing());
    return std::vector<Tensor>{mul(in[0], 3.0)};
  });
  CHECK_FALSE(in_compiled_call());
  for (int i = 0; i < 4; ++i) {
    const Tensor x = from_vector<float>({1.0f * i, 2.0f}, {2});
    CHECK(cf({x})[0].to_vector<float>() == std::vector<float>{3.0f * i, 6.0f});
  }
  CHECK(calls == 4);
  const CompileStats s = cf.stats();
  CHECK(s.eager_calls == 4);
  CHECK(s.captures == 0);
  CHECK(s.graphs == 0);
}

TEST_CASE("inside a compiled call zero_grad zeroes in place and backward accumulates into the same buffer") {
  Tensor w = from_vector<double>({1.0, 2.0}, {2}, {.requires_grad = true});
  std::vector<const void*> seen;
  CompiledFunction cf = compile([&](const std::vector<Tensor>& in) {
    w.zero_grad();
    Tensor loss = sum(mul(mul(w, w), in[0]));
    loss.backward();
    seen.push_back(w.grad().data_ptr());
    return std::vector<Tensor>{loss};
  });
  const Tensor x = from_vector<double>({1.0, 10.0}, {2});
  cf({x});
  cf({x});
  CHECK(w.grad().to_vector<double>() == std::vector<double>{2.0, 40.0});  // zeroed, not doubled
  REQUIRE(seen.size() == 2);
  CHECK(seen[0] == seen[1]);
  // Outside a compiled call zero_grad drops the gradient, as before.
  w.zero_grad();
  CHECK_FALSE(w.grad().defined());
}

TEST_CASE("a gradient zeroed inside a compiled call reads as zeros and is replaced, not added to, by the next backward") {
  Tensor w = from_vector<double>({1.0, 2.0}, {2}, {.requires_grad = true});
  sum(mul(w, 5.0)).backward();
  CompiledFunction zero = compile([&](const std::vector<Tensor>& in) {
    w.zero_grad();
    return in;
  });
  zero({ones({1})});
  const void* buffer = w.grad().data_ptr();
  CHECK(w.grad().to_vector<double>() == std::vector<double>{0.0, 0.0});  // read: zeros
  CHECK(w.grad().data_ptr() == buffer);
  zero({ones({1})});
  sum(mul(w, 3.0)).backward();  // eager, after a compiled zero_grad: 3, not 5 + 3
  CHECK(w.grad().to_vector<double>() == std::vector<double>{3.0, 3.0});
}
