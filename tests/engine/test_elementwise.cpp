// Elementwise ops on the CPU: values against std:: math and hand-computed numbers,
// NaN/Inf conventions shared with the GPU kernels, dtype rules, broadcasting and scalar
// forms, errors, and gradient checks in f64.
#include <doctest/doctest.h>

#include "error_message.h"

#include <cmath>
#include <limits>
#include <string>

#include "core/registry.h"
#include "gradcheck.h"
#include "kiln/kiln.h"
#include "test_values.h"

using namespace kiln;
using kiln::testing::gradcheck;

namespace {
using kiln_test::kNaN;
using kiln_test::kInf;
using kiln_test::f64;
using kiln_test::f32;
using kiln_test::message_of;


Tensor f64(std::vector<double> v) { return f64(v, {static_cast<std::int64_t>(v.size())}); }
Tensor f32(std::vector<float> v) { return f32(v, {static_cast<std::int64_t>(v.size())}); }
Tensor i32(std::vector<std::int32_t> v) { return from_vector(v); }
Tensor boolean(std::vector<bool> v) {
  std::vector<std::uint8_t> u(v.begin(), v.end());
  return from_vector(u).to(DType::boolean);
}
std::vector<bool> bools(const Tensor& t) {
  REQUIRE(t.dtype() == DType::boolean);
  std::vector<bool> r;
  for (bool b : t.to_vector<bool>()) r.push_back(b);
  return r;
}

// NaN equals NaN; otherwise within a relative tolerance (0 for exact checks).
bool same(double got, double want, double rtol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(got - want) <= rtol * std::max(1.0, std::fabs(want));
}

void check_values(const Tensor& t, const std::vector<double>& want, double rtol = 0) {
  std::vector<double> got = t.to_vector<double>();
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    CHECK_MESSAGE(same(got[i], want[i], rtol), "element " << i << ": got " << got[i] << ", want " << want[i]);
}


const std::vector<double> kProbe{-2.5, -1.0, -0.5, 0.0, 0.3, 1.0, 2.0, kInf, -kInf, kNaN};

}  // namespace

TEST_CASE("floating unary ops match std:: math in f64 and f32, NaN and Inf included") {
  struct Case {
    const char* name;
    Tensor (*op)(const Tensor&);
    double (*ref)(double);
  };
  const Case cases[] = {
      {"exp", exp, [](double x) { return std::exp(x); }},
      {"log", log, [](double x) { return std::log(x); }},
      {"log1p", log1p, [](double x) { return std::log1p(x); }},
      {"expm1", expm1, [](double x) { return std::expm1(x); }},
      {"sqrt", sqrt, [](double x) { return std::sqrt(x); }},
      {"rsqrt", rsqrt, [](double x) { return 1 / std::sqrt(x); }},
      {"sin", sin, [](double x) { return std::sin(x); }},
      {"cos", cos, [](double x) { return std::cos(x); }},
      {"tanh", tanh, [](double x) { return std::tanh(x); }},
      {"erf", erf, [](double x) { return std::erf(x); }},
      {"sigmoid", sigmoid, [](double x) { return 1 / (1 + std::exp(-x)); }},
      {"gelu", gelu, [](double x) { return x * 0.5 * std::erfc(-x / std::sqrt(2.0)); }},
      {"silu", silu, [](double x) { return x / (1 + std::exp(-x)); }},
      {"softplus", softplus, [](double x) { return x > 20 ? x : std::log(1 + std::exp(x)); }},
      {"floor", floor, [](double x) { return std::floor(x); }},
      {"ceil", ceil, [](double x) { return std::ceil(x); }},
      {"abs", abs, [](double x) { return std::fabs(x); }},
      {"square", square, [](double x) { return x * x; }},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    std::vector<double> want;
    for (double x : kProbe) want.push_back(c.ref(x));
    if (std::string(c.name) == "sin" || std::string(c.name) == "cos") want[7] = want[8] = kNaN;
    // gelu(-inf) = -inf * 0 is NaN in both the kernel's formula and ours.
    if (std::string(c.name) == "gelu") want[8] = kNaN;
    Tensor y = c.op(f64(kProbe));
    CHECK(y.dtype() == DType::f64);
    check_values(y, want, 1e-14);
    Tensor y32 = c.op(f64(kProbe).to(DType::f32));
    CHECK(y32.dtype() == DType::f32);
    check_values(y32, want, 1e-6);
  }
}

TEST_CASE("activations at hand-computed points") {
  check_values(sigmoid(f64({0, 2})), {0.5, 0.8807970779778823}, 1e-15);
  check_values(gelu(f64({1, -1, 0})), {0.8413447460685429, -0.15865525393145707, 0}, 1e-15);
  check_values(silu(f64({1})), {0.7310585786300049}, 1e-15);
  check_values(softplus(f64({0, 30, -30})), {std::log(2.0), 30, 9.357622968840175e-14}, 1e-12);
  check_values(relu(f64({-1, 0, 2, kNaN, -kInf})), {0, 0, 2, kNaN, 0});
  check_values(leaky_relu(f64({-2, 3, kNaN}), 0.1), {-0.2, 3, kNaN}, 1e-15);
  check_values(leaky_relu(f64({-100})), {-1}, 1e-15);  // default slope 0.01
}

TEST_CASE("sign, round and clamp follow the kernels' conventions") {
  // sign(NaN) = 0 and sign(-0.0) = +0, as PyTorch.
  Tensor s = sign(f64({-3, -0.0, 0, 2, kNaN, -kInf}));
  check_values(s, {-1, 0, 0, 1, 0, -1});
  CHECK_FALSE(std::signbit(s.to_vector<double>()[1]));
  // Half to even.
  check_values(round(f64({0.5, 1.5, 2.5, -0.5, -1.5, 2.4, kNaN})), {0, 2, 2, -0.0, -2, 2, kNaN});
  check_values(clamp(f64({-2, 0.5, 3, kNaN}), -1.0, 1.0), {-1, 0.5, 1, kNaN});
  check_values(clamp(f64({-2, 0.5, 3}), std::nullopt, 1.0), {-2, 0.5, 1});
  check_values(clamp(f64({-2, 0.5, 3}), 0, std::nullopt), {0, 0.5, 3});
  check_values(clamp(f64({-2, 0.5, 3}), 2, 1), {1, 1, 1});  // min > max gives max
  Tensor ci = clamp(i32({-5, 3, 9}), 0, 4);
  CHECK(ci.dtype() == DType::i32);
  CHECK(ci.to_vector<std::int32_t>() == std::vector<std::int32_t>{0, 3, 4});
  CHECK(clamp(i32({-5, 3}), 0.5, std::nullopt).dtype() == DType::f32);  // a float bound promotes
  CHECK(message_of<ValueError>([] { clamp(f64({1}), std::nullopt, std::nullopt); }).starts_with("[clamp]"));
}

TEST_CASE("f16 and bf16 compute in f32 and round once") {
  for (DType t : {DType::f16, DType::bf16}) {
    CAPTURE(dtype_name(t));
    Tensor x = from_vector(std::vector<float>{1, 2, 0.5f}, {3}, {.dtype = t});
    Tensor e = exp(x), r = sqrt(x);
    CHECK(e.dtype() == t);
    for (int i = 0; i < 3; ++i) {
      const float xi = x.to_vector<float>()[static_cast<std::size_t>(i)];
      const float want_e = t == DType::f16 ? static_cast<float>(Half(std::exp(xi))) : static_cast<float>(BFloat16(std::exp(xi)));
      const float want_r = t == DType::f16 ? static_cast<float>(Half(std::sqrt(xi))) : static_cast<float>(BFloat16(std::sqrt(xi)));
      CHECK(e.to_vector<float>()[static_cast<std::size_t>(i)] == want_e);
      CHECK(r.to_vector<float>()[static_cast<std::size_t>(i)] == want_r);
    }
    CHECK(exp(x).to_vector<float>()[0] == 2.71875f);  // e rounded to 8 (bf16) or 11 (f16) bits
    CHECK(relu(from_vector(std::vector<float>{-1, 65504}, {2}, {.dtype = t})).to_vector<float>()[0] == 0);
    CHECK(bools(isnan(from_vector(std::vector<float>{1, NAN}, {2}, {.dtype = t}))) == std::vector<bool>{false, true});
  }
  // 2.9999 is stored as 3 in f16 (steps of 2^-9 in [2, 4)), so its floor is 3.
  Tensor h = from_vector(std::vector<float>{2.9999f}, {1}, {.dtype = DType::f16});
  CHECK(floor(h).to_vector<float>()[0] == 3);
}

TEST_CASE("dtype rules: float functions promote integers, integer ops keep them") {
  Tensor i = i32({-4, 0, 9});
  CHECK(exp(i).dtype() == DType::f32);
  check_values(sqrt(i), {kNaN, 0, 3});
  CHECK(sigmoid(boolean({true})).dtype() == DType::f32);
  CHECK(abs(i).dtype() == DType::i32);
  CHECK(abs(i).to_vector<std::int32_t>() == std::vector<std::int32_t>{4, 0, 9});
  CHECK(sign(i).to_vector<std::int32_t>() == std::vector<std::int32_t>{-1, 0, 1});
  CHECK(relu(i).to_vector<std::int32_t>() == std::vector<std::int32_t>{0, 0, 9});
  CHECK(square(i).to_vector<std::int32_t>() == std::vector<std::int32_t>{16, 0, 81});
  Tensor u = from_vector(std::vector<std::uint8_t>{20, 0, 255});
  CHECK(square(u).to_vector<std::int32_t>() == std::vector<std::int32_t>{144, 0, 1});  // u8 wraps
  CHECK(sign(u).to_vector<std::int32_t>() == std::vector<std::int32_t>{1, 0, 1});
  Tensor l = from_vector(std::vector<std::int64_t>{-3, 7});
  CHECK(floor(l).dtype() == DType::i64);
  CHECK(round(l).to_vector<std::int64_t>() == std::vector<std::int64_t>{-3, 7});
  CHECK(bools(logical_not(f64({0, -0.0, 2, kNaN}))) == std::vector<bool>{true, true, false, false});
  CHECK(bools(logical_not(i)) == std::vector<bool>{false, true, false});
  CHECK(bools(isnan(i)) == std::vector<bool>{false, false, false});
  CHECK(bools(isnan(f64({kNaN, kInf, 0}))) == std::vector<bool>{true, false, false});
  // bool has no arithmetic: a DTypeError naming the op and the dtypes it takes.
  std::string m = message_of<DTypeError>([] { abs(boolean({true})); });
  CHECK(m.starts_with("[abs]"));
  CHECK(m.find("bool") != std::string::npos);
  CHECK_THROWS_AS(floor(boolean({true})), DTypeError);
  CHECK_THROWS_AS(relu(boolean({true})), DTypeError);
  CHECK_THROWS_AS(maximum(boolean({true}), boolean({false})), DTypeError);
}

TEST_CASE("pow, maximum, minimum: broadcasting, scalars on either side, NaN") {
  Tensor a = f64({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor col = f64({2, 0.5}, {2, 1});
  check_values(pow(a, col), {1, 4, 9, 2, std::sqrt(5.0), std::sqrt(6.0)}, 1e-15);
  check_values(pow(a, 2), {1, 4, 9, 16, 25, 36});
  check_values(pow(2, f64({0, 3, -1})), {1, 8, 0.5});
  check_values(pow(f64({-8, 0, kNaN}), f64({1.0 / 3, -1, 0})), {kNaN, kInf, 1});
  CHECK(pow(i32({2, 3}), 2).dtype() == DType::f32);
  Tensor x = f64({1, kNaN, 3, -kInf});
  Tensor y = f64({2, 0, kNaN, 5});
  check_values(maximum(x, y), {2, kNaN, kNaN, 5});
  check_values(minimum(x, y), {1, kNaN, kNaN, -kInf});
  check_values(maximum(x, 2.0), {2, kNaN, 3, 2});
  check_values(minimum(x, 2.0), {1, kNaN, 2, -kInf});
  Tensor mi = maximum(i32({-1, 7}), from_vector(std::vector<std::int64_t>{0}));
  CHECK(mi.dtype() == DType::i64);
  CHECK(mi.to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 7});
  CHECK(maximum(i32({1, 5}), 2.5).to_vector<float>() == std::vector<float>{2.5, 5});
  check_values(maximum(a, col), {2, 2, 3, 4, 5, 6});
  std::string m = message_of<ShapeError>([&] { minimum(a, f64({1, 2})); });
  CHECK(m.starts_with("[minimum]"));
  CHECK(m.find(shape_str({2, 3})) != std::string::npos);
  CHECK(m.find(shape_str({2})) != std::string::npos);
}

TEST_CASE("comparisons and logical ops: bool results, promotion, scalars, operators") {
  Tensor a = f32({1, 2, 3}, {3});
  Tensor b = f32({3, 2, 1}, {3});
  CHECK(bools(eq(a, b)) == std::vector<bool>{false, true, false});
  CHECK(bools(ne(a, b)) == std::vector<bool>{true, false, true});
  CHECK(bools(lt(a, b)) == std::vector<bool>{true, false, false});
  CHECK(bools(le(a, b)) == std::vector<bool>{true, true, false});
  CHECK(bools(gt(a, b)) == std::vector<bool>{false, false, true});
  CHECK(bools(ge(a, b)) == std::vector<bool>{false, true, true});
  CHECK(bools(a < 2) == std::vector<bool>{true, false, false});
  CHECK(bools(2 < a) == std::vector<bool>{false, false, true});
  CHECK(bools(2 >= a) == std::vector<bool>{true, true, false});
  CHECK(bools(a == 2) == std::vector<bool>{false, true, false});
  CHECK(bools(a != b) == std::vector<bool>{true, false, true});
  // i32 against 2.5 compares in f32, not after truncating the scalar.
  CHECK(bools(gt(i32({2, 3}), 2.5)) == std::vector<bool>{false, true});
  CHECK(bools(eq(i32({2, 3}), f64({2.0}, {}))) == std::vector<bool>{true, false});
  // NaN is unequal to everything, itself included.
  Tensor n = f64({kNaN, 1});
  CHECK(bools(eq(n, n)) == std::vector<bool>{false, true});
  CHECK(bools(ne(n, n)) == std::vector<bool>{true, false});
  CHECK(bools(lt(n, kInf)) == std::vector<bool>{false, true});
  // Broadcasting: [2,1] against [3].
  Tensor col = f32({1, 3}, {2, 1});
  Tensor c = le(col, a);
  CHECK(c.shape() == Shape{2, 3});
  CHECK(bools(c) == std::vector<bool>{true, true, true, false, false, true});
  Tensor t = boolean({true, true, false, false});
  Tensor u = boolean({true, false, true, false});
  CHECK(bools(logical_and(t, u)) == std::vector<bool>{true, false, false, false});
  CHECK(bools(logical_or(t, u)) == std::vector<bool>{true, true, true, false});
  CHECK(bools(logical_and(f64({0.5, 0, kNaN, 2}), i32({1, 1, 1, 0}))) == std::vector<bool>{true, false, true, false});
  CHECK(bools(logical_or(i32({0, 3}), 0)) == std::vector<bool>{false, true});
  CHECK(bools(logical_and(i32({0, 3}), true)) == std::vector<bool>{false, true});
  CHECK(bools(logical_not(t)) == std::vector<bool>{false, false, true, true});
  // Not differentiable: no history even from inputs that require grad.
  Tensor g = f64({1, 2}).requires_grad_();
  CHECK_FALSE(gt(g, 1.5).requires_grad());
  CHECK_FALSE(isnan(g).requires_grad());
  CHECK(message_of<ShapeError>([&] { eq(a, f32({1, 2})); }).starts_with("[eq]"));
}

TEST_CASE("where: bool condition, promotion, broadcasting over all three, scalars") {
  Tensor cond = boolean({true, false, true});
  Tensor a = f32({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = i32({-1, -2}).reshape({2, 1});
  Tensor w = where(cond, a, b);
  CHECK(w.dtype() == DType::f32);
  CHECK(w.shape() == Shape{2, 3});
  CHECK(w.to_vector<float>() == std::vector<float>{1, -1, 3, 4, -2, 6});
  CHECK(where(cond, i32({1, 2, 3}), 0).to_vector<std::int32_t>() == std::vector<std::int32_t>{1, 0, 3});
  CHECK(where(cond, 0.5, i32({1, 2, 3})).to_vector<float>() == std::vector<float>{0.5, 2, 0.5});
  check_values(where(cond, f64({kNaN, 1, kInf}), f64({0}, {})), {kNaN, 0, kInf});
  Tensor bw = where(boolean({false, true}), boolean({true, true}), boolean({false, false}));
  CHECK(bools(bw) == std::vector<bool>{false, true});
  std::string m = message_of<DTypeError>([&] { where(f32({1, 0, 1}), a, b); });
  CHECK(m.starts_with("[where]"));
  CHECK(m.find("f32") != std::string::npos);
  CHECK(message_of<ShapeError>([&] { where(boolean({true, false}), a, b); }).starts_with("[where]"));
}

TEST_CASE("non-contiguous inputs: transposed and broadcast views") {
  Tensor a = f64({1, -2, 3, -4, 5, -6}, {2, 3});
  Tensor t = make_view(a, {3, 2}, {1, 3}, 0);  // a transposed: 1 -4 / -2 5 / 3 -6
  check_values(relu(t), {1, 0, 0, 5, 3, 0});
  check_values(maximum(t, f64({0, 2}, {2})), {1, 2, 0, 5, 3, 2});
  CHECK(bools(gt(t, broadcast_to(f64({0}, {1}), {3, 2}))) == std::vector<bool>{true, false, false, true, true, false});
}

TEST_CASE("gradients of the unary ops pass gradcheck in f64") {
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> op;
    double low, high;
  };
  const Case cases[] = {
      {"abs", [](const Tensor& x) { return abs(x); }, -2, 2},
      {"square", [](const Tensor& x) { return square(x); }, -2, 2},
      {"exp", [](const Tensor& x) { return exp(x); }, -2, 2},
      {"log", [](const Tensor& x) { return log(x); }, 0.3, 3},
      {"log1p", [](const Tensor& x) { return log1p(x); }, -0.5, 2},
      {"expm1", [](const Tensor& x) { return expm1(x); }, -2, 2},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, 0.3, 3},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, 0.3, 3},
      {"sin", [](const Tensor& x) { return sin(x); }, -3, 3},
      {"cos", [](const Tensor& x) { return cos(x); }, -3, 3},
      {"tanh", [](const Tensor& x) { return tanh(x); }, -2, 2},
      {"erf", [](const Tensor& x) { return erf(x); }, -2, 2},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, -4, 4},
      {"relu", [](const Tensor& x) { return relu(x); }, -2, 2},
      {"leaky_relu", [](const Tensor& x) { return leaky_relu(x, 0.2); }, -2, 2},
      {"gelu", [](const Tensor& x) { return gelu(x); }, -3, 3},
      {"silu", [](const Tensor& x) { return silu(x); }, -3, 3},
      {"softplus", [](const Tensor& x) { return softplus(x); }, -4, 4},
      {"clamp", [](const Tensor& x) { return clamp(x, -1.0, 1.0); }, -2, 2},
      {"floor", [](const Tensor& x) { return floor(x); }, -2, 2},
      {"sign", [](const Tensor& x) { return sign(x); }, -2, 2},
  };
  Generator gen(7);
  for (const Case& c : cases) {
    CAPTURE(c.name);
    Tensor x = add(mul(rand({3, 4}, {.dtype = DType::f64}, &gen), c.high - c.low), c.low);
    auto r = gradcheck([&](const auto& in) { return c.op(in[0]); }, {x});
    CHECK_MESSAGE(r.ok, r.message);
  }
}

TEST_CASE("gradients of the binary ops and where, with broadcasting") {
  Generator gen(11);
  auto uniform = [&](Shape s, double lo, double hi) {
    return add(mul(rand(s, {.dtype = DType::f64}, &gen), hi - lo), lo);
  };
  Tensor a = uniform({2, 3}, 0.5, 2), b = uniform({3}, -1.5, 1.5), c = uniform({2, 1}, -2, 2);
  auto check = [](auto f, std::vector<Tensor> in) {
    auto r = gradcheck(f, in);
    CHECK_MESSAGE(r.ok, r.message);
  };
  check([](const auto& x) { return pow(x[0], x[1]); }, {a, b});
  check([](const auto& x) { return pow(x[0], 2.5); }, {a});
  check([](const auto& x) { return pow(3.0, x[0]); }, {b});
  check([](const auto& x) { return maximum(x[0], x[1]); }, {b, c});
  check([](const auto& x) { return minimum(x[0], x[1]); }, {b, c});
  check([](const auto& x) { return maximum(x[0], 0.25); }, {c});
  check([](const auto& x) { return minimum(x[0], 0.25); }, {c});
  Tensor cond = boolean({true, false, true});
  check([&](const auto& x) { return where(cond, x[0], x[1]); }, {a, c});
  check([&](const auto& x) { return where(cond, x[0], 1.5); }, {c});
}

TEST_CASE("gradient special cases: ties split, clamp bounds, pow at zero, zero-gradient ops") {
  Tensor a = f64({1, 2, 3}).requires_grad_();
  Tensor b = f64({2, 2, 2}).requires_grad_();
  sum(maximum(a, b)).backward();
  check_values(a.grad(), {0, 0.5, 1});
  check_values(b.grad(), {1, 0.5, 0});

  Tensor x = f64({-2, -1, 0, 1, 2}).requires_grad_();
  sum(clamp(x, -1.0, 1.0)).backward();
  check_values(x.grad(), {0, 1, 1, 1, 0});  // inclusive bounds, as PyTorch

  Tensor y = f64({-2, 1, 3}).requires_grad_();
  sum(clamp(y, 2.0, 1.0)).backward();  // min > max: constant output
  check_values(y.grad(), {0, 0, 0});

  // d/db of 0^b is 0 for b >= 0 (no 0 * -inf NaN); d/da with b == 0 is 0.
  Tensor base = f64({0, 0, 2}).requires_grad_();
  Tensor ex = f64({2, 0, 0}).requires_grad_();
  sum(pow(base, ex)).backward();
  check_values(ex.grad(), {0, 0, std::log(2.0)}, 1e-15);
  check_values(base.grad(), {0, 0, 0});

  Tensor z = f64({-1.5, 0.3, 2.7}).requires_grad_();
  sum(add(add(round(z), ceil(z)), sign(z))).backward();
  check_values(z.grad(), {0, 0, 0});

  Tensor r = f64({-1, 0, 2}).requires_grad_();
  sum(relu(r)).backward();
  check_values(r.grad(), {0, 0, 1});
}

TEST_CASE("the registry's hints make every elementwise op pass gradcheck") {
  for (const char* name : {"abs", "sign", "square", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos",
                           "tanh", "erf", "sigmoid", "relu", "leaky_relu", "gelu", "silu", "softplus", "floor",
                           "ceil", "round", "clamp", "pow", "pow_scalar", "rpow_scalar", "maximum", "minimum",
                           "maximum_scalar", "minimum_scalar"}) {
    const OpDef& op = get_op(name);
    CHECK_MESSAGE(op.vjp, name);
    CHECK_MESSAGE(op.gpu, name);
    for (const std::string& f : kiln::testing::gradcheck_op(op)) FAIL_CHECK(f);
  }
  for (const char* name : {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "eq_scalar", "ge_scalar",
                           "logical_or_scalar", "logical_not", "isnan"}) {
    CHECK_MESSAGE(!get_op(name).vjp, name);
    CHECK_MESSAGE(get_op(name).gpu, name);
  }
  CHECK(get_op("where").gpu);
}

TEST_CASE("add/sub/mul/div cover every dtype the kernels have, with scalar forms") {
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    CAPTURE(dtype_name(t));
    Tensor x = from_vector(std::vector<double>{6, 3}, {2}, {.dtype = DType::f64}).to(t);
    CHECK((x + x).dtype() == t);
    CHECK((x - 1).to_vector<double>() == std::vector<double>{5, 2});
    CHECK((9 - x).to_vector<double>() == std::vector<double>{3, 6});
    CHECK((x * x).to_vector<double>() == std::vector<double>{36, 9});
    CHECK((12 / x).to_vector<double>() == std::vector<double>{2, 4});
    CHECK((x / 2).dtype() == (is_floating(t) ? t : DType::f32));
  }
  CHECK_THROWS_AS(add(boolean({true}), boolean({true})), DTypeError);
}
