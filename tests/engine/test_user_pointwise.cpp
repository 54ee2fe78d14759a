// User pointwise ops (kiln/pointwise.h) on the CPU: values against hand-written C++ in every
// floating dtype, broadcasting, gradients through the gradient expressions (f64 gradcheck),
// the parser's errors with their columns, and registration rules. No GPU needed.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/registry.h"
#include "ops/user_pointwise.h"
#include "gradcheck.h"
#include "user_ops.h"
#include "error_message.h"
#include "kiln/kiln.h"
#include "kiln/pointwise.h"
#include "kiln/runtime/compiler.h"
#include "kiln/runtime/kernel_registry.h"
#include "compile_check.h"

using namespace kiln;
using kiln::testing::gradcheck;
using kiln_test::message_of;
using kiln_test::mix;
using kiln_test::ratio;
using kiln_test::swish;

namespace {

// Storage rounding of dtype t for a value computed in C.
double stored(DType t, double v) {
  switch (t) {
    case DType::f32:
      return static_cast<float>(v);
    case DType::f16:
      return static_cast<float>(Half(static_cast<float>(v)));
    case DType::bf16:
      return static_cast<float>(BFloat16(static_cast<float>(v)));
    default:
      return v;
  }
}

double user_op_tolerance(DType t) { return t == DType::f64 ? 1e-14 : t == DType::f32 ? 1e-6 : t == DType::f16 ? 2e-3 : 1e-2; }

std::string message_of_syntax(const std::string& expr, int* column) {
  try {
    pointwise("bad_syntax", expr, {zeros({2})}, {.params = {{"beta", 1.0}}});
  } catch (const ExpressionError& e) {
    *column = e.column();
    return e.what();
  }
  FAIL("no ExpressionError for \"" << expr << "\"");
  return {};
}

}  // namespace

TEST_CASE("a user pointwise op computes like hand-written C++ in every floating dtype") {
  const std::vector<double> xs{-3.5, -1, -0.25, 0, 0.5, 1.75, 4};
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    CAPTURE(dtype_name(t));
    Tensor x = from_vector(xs, {7}, {.dtype = t});
    Tensor y = swish(x, 1.5);
    REQUIRE(y.dtype() == t);
    const std::vector<double> got = y.to_vector<double>();
    const std::vector<double> in = x.to_vector<double>();
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const double want = t == DType::f64 ? in[i] / (1 + std::exp(-1.5 * in[i]))
                                          : stored(t, in[i] / (1 + std::exp(-1.5f * static_cast<float>(in[i]))));
      CHECK(got[i] == doctest::Approx(want).epsilon(user_op_tolerance(t)));
    }
  }
  // Integers compute in f32, as the built-in float ops do.
  Tensor yi = swish(from_vector(std::vector<std::int32_t>{2}), 1.0);
  CHECK(yi.dtype() == DType::f32);
  CHECK(yi.to_vector<float>()[0] == doctest::Approx(2 / (1 + std::exp(-2.0))));
}

TEST_CASE("a binary user op broadcasts and reads its params per call") {
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    CAPTURE(dtype_name(t));
    Tensor a = from_vector(std::vector<double>{1, -2, 3}, {3, 1}, {.dtype = t});
    Tensor b = from_vector(std::vector<double>{0.5, 4, -1, 2}, {1, 4}, {.dtype = t});
    for (double w : {0.25, 0.75}) {
      Tensor y = mix(a, b, w, 0.5);
      REQUIRE(y.shape() == Shape{3, 4});
      REQUIRE(y.dtype() == t);
      const std::vector<double> got = y.to_vector<double>();
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 4; ++j) {
          const double av = std::vector<double>{1, -2, 3}[i], bv = std::vector<double>{0.5, 4, -1, 2}[j];
          CHECK(got[static_cast<std::size_t>(i * 4 + j)] ==
                doctest::Approx(stored(t, av + w * (bv - av) + 0.5 * av * bv)).epsilon(user_op_tolerance(t)));
        }
    }
  }
  // Mixed dtypes promote before the expression runs.
  Tensor y =
      mix(from_vector(std::vector<float>{1}), from_vector(std::vector<double>{3}, {1}, {.dtype = DType::f64}), 0.5, 0);
  CHECK(y.dtype() == DType::f64);
  CHECK(y.to_vector<double>()[0] == 2.0);
}

TEST_CASE("the language: precedence, unary minus, comparisons and the functions") {
  Tensor x = from_vector(std::vector<double>{-2, 0.5, 3}, {3}, {.dtype = DType::f64});
  auto run = [&](const char* name, const char* e) { return pointwise(name, e, {x}).to_vector<double>(); };
  CHECK(run("lang_prec", "1 + 2 * x - x / 2") == std::vector<double>{-2, 1.75, 5.5});
  CHECK(run("lang_neg", "-x * -2 + +1") == std::vector<double>{-3, 2, 7});
  CHECK(run("lang_cmp", "(x > 0) + (x <= 0.5) * 10 + (x == 3) * 100 + (x != 3) * 1000") ==
        std::vector<double>{1010, 1011, 101});
  CHECK(run("lang_fns", "maximum(abs(x), pow(x, 2)) + minimum(sign(x), relu(x)) + floor(x / 2) + ceil(1.5e-1)") ==
        std::vector<double>{4 - 1 - 1 + 1, 0.5 + 0.5 + 0 + 1, 9 + 1 + 1 + 1});
  const std::vector<double> s = run("lang_smooth", "sqrt(exp(log(1 + x * x))) * rsqrt(1) + tanh(0) + erf(0)");
  CHECK(s[2] == doctest::Approx(std::sqrt(10.0)));
}

TEST_CASE("gradients flow through the gradient expressions (f64 gradcheck)") {
  Tensor x = from_vector(std::vector<double>{-1.5, -0.2, 0.3, 2}, {4}, {.dtype = DType::f64});
  auto r = gradcheck([](const auto& in) { return swish(in[0], 1.3); }, {x});
  CHECK_MESSAGE(r.ok, r.message);

  // Broadcast inputs: the gradients are summed back to (3,1) and (1,4).
  Tensor a = from_vector(std::vector<double>{0.5, -1, 2}, {3, 1}, {.dtype = DType::f64});
  Tensor b = from_vector(std::vector<double>{1, 1.5, -2, 3}, {1, 4}, {.dtype = DType::f64});
  auto r2 = gradcheck([](const auto& in) { return mix(in[0], in[1], 0.3, -0.7); }, {a, b});
  CHECK_MESSAGE(r2.ok, r2.message);
  auto r3 = gradcheck([](const auto& in) { return ratio(in[0], in[1]); }, {a, b});
  CHECK_MESSAGE(r3.ok, r3.message);

  // A gradient that reads the output y; one that reads g only; one that reads no tensor.
  auto expo = [](const Tensor& t) { return pointwise("expo", "exp(2 * x)", {t}, {.grads = {"2 * g * y"}}); };
  auto r4 = gradcheck([&](const auto& in) { return expo(in[0]); }, {x});
  CHECK_MESSAGE(r4.ok, r4.message);
  auto lin = [](const Tensor& p, const Tensor& q) {
    return pointwise("lin", "3 * a + q", {p, q}, {.inputs = {"a", "q"}, .grads = {"3 * g", "g"}});
  };
  auto r5 = gradcheck([&](const auto& in) { return lin(in[0], in[1]); }, {a, b});
  CHECK_MESSAGE(r5.ok, r5.message);
  Tensor off_grid = from_vector(std::vector<double>{-1.5, -0.2, 0.3, 2.5}, {4}, {.dtype = DType::f64});
  auto flat = [](const Tensor& t) { return pointwise("flat", "floor(x)", {t}, {.grads = {"0"}}); };
  auto r6 = gradcheck([&](const auto& in) { return flat(in[0]); }, {off_grid});
  CHECK_MESSAGE(r6.ok, r6.message);
}

TEST_CASE("a gradient of more than two tensors runs as steps, each a user pointwise op") {
  (void)ratio(ones({1}), ones({1}));
  const OpDef* whole = find_op("ratio.grad_a");
  REQUIRE(whole != nullptr);  // g / b: two tensors, one op
  CHECK(is_user_pointwise(*whole));
  CHECK(find_op("ratio.grad_b") == nullptr);  // -g * a / (b * b): three tensors
  int steps = 0;
  while (const OpDef* step = find_op("ratio.grad_b." + std::to_string(steps))) {
    CHECK(is_user_pointwise(*step));
    CHECK(step->num_inputs <= 2);
    CHECK(rt::find_kernel(step->name) != nullptr);
    ++steps;
  }
  CHECK(steps >= 2);
  CHECK_FALSE(is_user_pointwise(get_op("relu")));
}

TEST_CASE("the device expression sits on the OpDef and its kernel spec is registered") {
  (void)swish(ones({1}), 1.0);
  (void)mix(ones({1}), ones({1}), 0.5, 0.5);
  const OpDef& s = get_op("swish");
  REQUIRE(pointwise_expr(s) != nullptr);
  CHECK(pointwise_expr(s)->expr == "(x * kiln::math::sigmoid((C(p0) * x)))");
  CHECK(pointwise_expr(s)->domain == kernels::PointwiseDomain::floating);
  CHECK(pointwise_params(s, Attrs{{"beta", 2.5}}) == std::pair{2.5, 0.0});
  const rt::KernelSpec* spec = rt::find_kernel("swish");
  REQUIRE(spec != nullptr);
  CHECK(spec->template_name == "elementwise_unary");

  const OpDef& m = get_op("mix");
  CHECK(pointwise_expr(m)->expr == "((a + (C(p0) * (b - a))) + ((C(p1) * a) * b))");
  CHECK(pointwise_params(m, Attrs{{"w", 0.1}, {"c", 0.2}}) == std::pair{0.1, 0.2});
  CHECK(rt::find_kernel("mix")->template_name == "elementwise_binary");
  CHECK(s.vjp);
  CHECK(s.save.inputs == std::vector<int>{0});
}

TEST_CASE("syntax errors and unknown names are CompileErrors naming the op, the expression and the column") {
  int col = 0;
  CHECK(message_of_syntax("x * sigmoid(beta * x", &col) ==
        R"([pointwise bad_syntax] expected ')' at column 21 in "x * sigmoid(beta * x")");
  CHECK(col == 21);
  struct Case {
    const char* expr;
    int column;
    const char* what;
  };
  const Case cases[] = {
      {"((x + 1)", 9, "expected ')'"},
      {"(x + 1))", 8, "unexpected ')'"},
      {"x + foo(x)", 5, "unknown function 'foo'"},
      {"x * z + 1", 5, "unknown name 'z'"},
      {"y + x", 1, "unknown name 'y'"},  // y and g exist only in gradients
      {"x 1", 3, "unexpected '1'"},
      {"x + 1 $", 7, "unexpected '$'"},
      {"", 1, "empty expression"},
      {"   ", 1, "empty expression"},
      {"x +", 4, "the expression ends"},
      {"x * ()", 6, "unexpected ')'"},
      {"pow(x)", 6, "expected ','"},
      {"exp(x, 1)", 6, "'exp' takes one argument"},
      {"exp + x", 1, "function 'exp' needs '('"},
      {"1.2.3 * x", 1, "malformed number"},
      {"1e999 * x", 1, "out of range"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.expr);
    const std::string msg = message_of_syntax(c.expr, &col);
    CHECK(col == c.column);
    CHECK(msg.find(c.what) != std::string::npos);
    CHECK(msg.rfind("[pointwise bad_syntax] ", 0) == 0);
    CHECK(msg.find("at column " + std::to_string(c.column) + " in \"" + c.expr + "\"") != std::string::npos);
  }
  // It is a CompileError, and nothing was registered.
  CHECK_THROWS_AS(pointwise("bad_syntax", "x +", {zeros({1})}), CompileError);
  CHECK(find_op("bad_syntax") == nullptr);
  // A bad gradient names the gradient and registers nothing either.
  const std::string g =
      message_of<CompileError>([] { pointwise("bad_grad", "x", {zeros({1})}, {.grads = {"g * w"}}); });
  CHECK(g == R"([pointwise bad_grad.grad_x] unknown name 'w' at column 5 in "g * w")");
  CHECK(find_op("bad_grad") == nullptr);
}

TEST_CASE("registration: the same definition reuses the op, a different one is a ValueError") {
  (void)swish(ones({2}), 1.0);
  const OpDef* first = find_op("swish");
  (void)swish(ones({2}), 3.0);  // another param value: the same op
  CHECK(find_op("swish") == first);
  CHECK(message_of<ValueError>([] {
          pointwise("swish", "x * sigmoid(x)", {ones({1})});
        }).rfind("[pointwise swish] is already registered as \"x * sigmoid(beta * x)\"", 0) == 0);
  CHECK_THROWS_AS(pointwise("swish", "x * sigmoid(beta * x)", {ones({1})}, {.params = {{"beta", 1.0}}}), ValueError);
  CHECK_THROWS_AS(pointwise("relu", "x", {ones({1})}), ValueError);  // a built-in op's name
  CHECK_THROWS_AS(pointwise("two.words", "x", {ones({1})}), ValueError);
  CHECK_THROWS_AS(pointwise("arity", "x", {ones({1}), ones({1}), ones({1})}), ValueError);
  CHECK_THROWS_AS(pointwise("names", "a", {ones({1})}, {.inputs = {"a", "b"}}), ValueError);
  CHECK_THROWS_AS(pointwise("dup", "a + a", {ones({1}), ones({1})}, {.inputs = {"a", "a"}}), ValueError);
  CHECK_THROWS_AS(pointwise("fn_name", "exp", {ones({1})}, {.inputs = {"exp"}}), ValueError);
  CHECK_THROWS_AS(pointwise("three", "x", {ones({1})}, {.params = {{"p", 1}, {"q", 2}, {"r", 3}}}), ValueError);
  CHECK_THROWS_AS(pointwise("grads", "a * b", {ones({1}), ones({1})}, {.grads = {"g"}}), ValueError);
}

TEST_CASE("an op without gradient expressions refuses an input that requires grad") {
  Tensor x = ones({2}, {.requires_grad = true});
  const std::string msg = message_of<ValueError>([&] { pointwise("no_grad_op", "2 * x", {x}); });
  CHECK(msg.rfind("[pointwise no_grad_op] an input requires grad", 0) == 0);
  NoGradGuard guard;
  CHECK(pointwise("no_grad_op", "2 * x", {x}).to_vector<float>() == std::vector<float>{2, 2});
}

TEST_CASE("user op kernels, forward and gradient steps, compile with NVRTC (no GPU needed)") {
  (void)swish(ones({1}), 1.0);
  (void)mix(ones({1}), ones({1}), 0.5, 0.5);
  (void)ratio(ones({1}), ones({1}));
  // "add" covers the scalar variant of the binary template that user ops share.
  std::vector<kiln_test::CompileJob> jobs;
  for (const char* op :
       {"swish", "swish.grad_x", "mix", "mix.grad_b", "ratio.grad_b.0", "ratio.grad_b.1", "ratio.grad_b.2", "add"}) {
    const rt::KernelSpec* spec = rt::find_kernel(op);
    REQUIRE_MESSAGE(spec != nullptr, op);
    for (DType t : {DType::f16, DType::f64})
      for (std::uint32_t v : spec->variants) jobs.push_back({spec, DTypes{t, t}, v, 90});
  }
  const kiln_test::CompileSummary r = kiln_test::compile_all(jobs);
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    CAPTURE(jobs[i].spec->op);
    CAPTURE(jobs[i].dtypes.str());
    CAPTURE(jobs[i].variant);
    CHECK_MESSAGE(r.outcomes[i].error.empty(), r.outcomes[i].error);
    CHECK(r.outcomes[i].ptx.find(jobs[i].spec->entry) != std::string::npos);
  }
}
