// Reductions on the CPU: values against naive double loops written here, keepdim,
// NaN/Inf, half-precision accumulation, integer widening, empty dims, errors, gradients.
#include <doctest/doctest.h>

#include "error_message.h"

#include <cmath>
#include <functional>
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
using kiln_test::message_of;

using Axes = std::vector<std::int64_t>;
using Values = std::vector<double>;


// Reduces row-major `data` of `shape` over `axes` (normalised) with `f`, which sees the
// reduced values in row-major order: the slow, obvious way.
Values reference(const Values& data, const Shape& shape, const std::vector<int>& axes,
                 const std::function<double(const Values&)>& f) {
  const int nd = static_cast<int>(shape.size());
  auto is_reduced = [&](int d) { return std::find(axes.begin(), axes.end(), d) != axes.end(); };
  Shape kept;
  for (int d = 0; d < nd; ++d)
    if (!is_reduced(d)) kept.push_back(shape[d]);
  std::vector<Values> groups(static_cast<std::size_t>(shape_numel(kept)));
  std::vector<std::int64_t> idx(static_cast<std::size_t>(nd), 0);
  for (std::size_t flat = 0; flat < data.size(); ++flat) {
    std::int64_t rem = static_cast<std::int64_t>(flat), out = 0;
    for (int d = nd - 1; d >= 0; --d) {
      idx[d] = rem % shape[d];
      rem /= shape[d];
    }
    for (int d = 0; d < nd; ++d)
      if (!is_reduced(d)) out = out * shape[d] + idx[d];
    groups[static_cast<std::size_t>(out)].push_back(data[flat]);
  }
  Values r;
  for (const auto& g : groups) r.push_back(f(g));
  return r;
}

double ref_sum(const Values& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}
double ref_var(const Values& v, double correction) {
  const double m = ref_sum(v) / static_cast<double>(v.size());
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return s / (static_cast<double>(v.size()) - correction);
}
double ref_lse(const Values& v) {
  double s = 0;
  for (double x : v) s += std::exp(x);
  return std::log(s);
}

// Deterministic, tie-free values in [-1.5, 1.5).
Values pattern(std::int64_t n) {
  Values v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[i] = std::fmod(static_cast<double>(i) * 0.6180339887, 3.0) - 1.5;
  return v;
}


// Within atol + rtol * |want|: sums near zero need the absolute part.
void check_close(const Tensor& got, const Values& want, double rtol, const std::string& what, double atol = 1e-10) {
  const Values g = got.to_vector<double>();
  REQUIRE_MESSAGE(g.size() == want.size(), what);
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (g[i] == want[i] || (std::isnan(g[i]) && std::isnan(want[i]))) continue;
    if (!(std::fabs(g[i] - want[i]) <= atol + rtol * std::fabs(want[i]))) {
      FAIL_CHECK(what << " element " << i << ": got " << g[i] << ", want " << want[i]);
      return;
    }
  }
}

}  // namespace

TEST_CASE("reductions match naive loops over several shapes and axis sets") {
  struct Case {
    Shape shape;
    Axes axes;
  };
  const std::vector<Case> cases = {{{}, {}},         {{}, {0}},          {{1}, {0}},        {{5, 7, 11, 13}, {0}},
                                   {{5, 7, 11, 13}, {1, 3}}, {{5, 7, 11, 13}, {-1}}, {{5, 7, 11, 13}, {0, 1, 2, 3}},
                                   {{5, 7, 11, 13}, {2}}};
  struct Op {
    const char* name;
    std::function<Tensor(const Tensor&, const Axes&, bool)> run;
    std::function<double(const Values&)> ref;
  };
  const std::vector<Op> ops = {
      {"sum", [](auto& t, auto& a, bool k) { return sum(t, a, k); }, ref_sum},
      {"mean", [](auto& t, auto& a, bool k) { return mean(t, a, k); },
       [](const Values& v) { return ref_sum(v) / static_cast<double>(v.size()); }},
      {"prod", [](auto& t, auto& a, bool k) { return prod(t, a, k); },
       [](const Values& v) {
         double p = 1;
         for (double x : v) p *= x;
         return p;
       }},
      {"max", [](auto& t, auto& a, bool k) { return max(t, a, k); },
       [](const Values& v) { return *std::max_element(v.begin(), v.end()); }},
      {"min", [](auto& t, auto& a, bool k) { return min(t, a, k); },
       [](const Values& v) { return *std::min_element(v.begin(), v.end()); }},
      {"var", [](auto& t, auto& a, bool k) { return var(t, a, k); }, [](const Values& v) { return ref_var(v, 1); }},
      {"var0", [](auto& t, auto& a, bool k) { return var(t, a, k, 0.0); },
       [](const Values& v) { return ref_var(v, 0); }},
      {"std", [](auto& t, auto& a, bool k) { return kiln::std(t, a, k); },
       [](const Values& v) { return std::sqrt(ref_var(v, 1)); }},
      {"logsumexp", [](auto& t, auto& a, bool k) { return logsumexp(t, a, k); }, ref_lse},
  };
  for (const auto& c : cases) {
    const Values data = pattern(shape_numel(c.shape));
    const Tensor x = f64(data, c.shape);
    const Tensor x32 = x.to(DType::f32);
    std::vector<int> axes;
    for (auto a : c.axes) axes.push_back(static_cast<int>(a < 0 ? a + static_cast<std::int64_t>(c.shape.size()) : a));
    if (c.shape.empty()) axes.clear();
    for (const auto& op : ops) {
      // prod of hundreds of values in [-1.5, 1.5) underflows to nothing worth comparing.
      if (std::string(op.name) == "prod" && shape_numel(c.shape) > 100 && c.axes.size() > 1) continue;
      const Values want = reference(data, c.shape, axes, op.ref);
      for (bool keepdim : {false, true}) {
        const std::string what = std::string(op.name) + " shape " + shape_str(c.shape) + " axes " +
                                  std::to_string(c.axes.size()) + (keepdim ? " keepdim" : "");
        const Tensor y = op.run(x, c.axes, keepdim);
        Shape want_shape;
        for (int d = 0; d < static_cast<int>(c.shape.size()); ++d) {
          const bool red = std::find(axes.begin(), axes.end(), d) != axes.end();
          if (!red) want_shape.push_back(c.shape[d]);
          else if (keepdim) want_shape.push_back(1);
        }
        CHECK_MESSAGE(y.shape() == want_shape, what);
        CHECK_MESSAGE(y.dtype() == DType::f64, what);
        check_close(y, want, 1e-12, what + " f64");
        const Tensor y32 = op.run(x32, c.axes, keepdim);
        CHECK_MESSAGE(y32.dtype() == DType::f32, what);
        check_close(y32, want, 2e-5, what + " f32", 2e-4);
      }
    }
  }
}

TEST_CASE("reductions read non-contiguous views") {
  // x is 4x6 row-major; its transpose is a 6x4 view with strides (1, 6).
  const Values data = pattern(24);
  const Tensor x = f64(data, {4, 6});
  const Tensor xt = make_view(x, {6, 4}, {1, 6}, 0);
  Values t(24);
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 4; ++j) t[i * 4 + j] = data[j * 6 + i];
  check_close(sum(xt, {1}), reference(t, {6, 4}, {1}, ref_sum), 1e-12, "sum of a transpose");
  check_close(var(xt, {0}), reference(t, {6, 4}, {0}, [](const Values& v) { return ref_var(v, 1); }), 1e-12,
              "var of a transpose");
  // Every other column: a stepped slice.
  const Tensor xs = make_view(x, {4, 3}, {6, 2}, 1);
  Values s;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) s.push_back(data[i * 6 + 1 + 2 * j]);
  check_close(max(xs, {0}), reference(s, {4, 3}, {0}, [](const Values& v) { return *std::max_element(v.begin(), v.end()); }),
              0, "max of a stepped slice");
  CHECK(argmax(xt).item<std::int64_t>() == std::max_element(t.begin(), t.end()) - t.begin());
}

TEST_CASE("full reductions give zero-dim tensors; hand-computed values") {
  const Tensor x = f64({1, 2, 3, 4}, {2, 2});
  CHECK(sum(x).dim() == 0);
  CHECK(sum(x).item<double>() == 10);
  CHECK(mean(x).item<double>() == 2.5);
  CHECK(prod(x).item<double>() == 24);
  CHECK(max(x).item<double>() == 4);
  CHECK(min(x).item<double>() == 1);
  CHECK(var(x).item<double>() == doctest::Approx(5.0 / 3));
  CHECK(var(x, all_axes(x), false, 0.0).item<double>() == doctest::Approx(1.25));
  CHECK(kiln::std(x).item<double>() == doctest::Approx(std::sqrt(5.0 / 3)));
  CHECK(logsumexp(x).item<double>() == doctest::Approx(std::log(std::exp(1.) + std::exp(2.) + std::exp(3.) + std::exp(4.))));
  CHECK(sum(x, {0}, true).shape() == Shape{1, 2});
  CHECK(sum(x, {0}, true).to_vector<double>() == Values{4, 6});
  CHECK(mean(x, {1}).to_vector<double>() == Values{1.5, 3.5});
  // Scalars reduce to themselves; var of one element with correction 1 is NaN, as in PyTorch.
  const Tensor s = scalar_tensor(3.0, {.dtype = DType::f64});
  CHECK(mean(s).item<double>() == 3);
  CHECK(std::isnan(var(s).item<double>()));
  CHECK(var(s, {}, false, 0.0).item<double>() == 0);
}

TEST_CASE("argmax and argmin: one axis or flattened, first occurrence, NaN wins") {
  const Tensor x = f64({1, 5, 5, 0, 2, 0}, {2, 3});
  CHECK(argmax(x).dtype() == DType::i64);
  CHECK(argmax(x).dim() == 0);
  CHECK(argmax(x).item<std::int64_t>() == 1);
  CHECK(argmin(x).item<std::int64_t>() == 3);
  CHECK(argmax(x, 1).to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 1});
  CHECK(argmin(x, -1).to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 0});
  CHECK(argmax(x, 0).to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 0, 0});
  CHECK(argmax(x, 0, true).shape() == Shape{1, 3});
  const Tensor n = f64({1, kNaN, 3, kNaN}, {4});
  CHECK(argmax(n).item<std::int64_t>() == 1);
  CHECK(argmin(n).item<std::int64_t>() == 1);
  const Tensor b = from_vector(std::vector<bool>{false, true, true}, Shape{3});
  CHECK(argmax(b).item<std::int64_t>() == 1);
  const Tensor i = from_vector(std::vector<std::int32_t>{4, -7, 9, -7}, Shape{4});
  CHECK(argmin(i).item<std::int64_t>() == 1);
  CHECK(argmax(scalar_tensor(2.0)).item<std::int64_t>() == 0);
  const std::string msg = message_of<ValueError>([&] { call(get_op("argmax"), {f64(pattern(8), {2, 2, 2})}, Attrs{{"axes", Axes{0, 1}}}); });
  CHECK(msg.find("[argmax]") == 0);
  CHECK(msg.find("(2,2,2)") != std::string::npos);
}

TEST_CASE("NaN and infinity propagate like PyTorch") {
  const Tensor x = f64({1, kNaN, 3, -kInf, 2, 5}, {2, 3});
  CHECK(std::isnan(max(x, {1}).to_vector<double>()[0]));
  CHECK(max(x, {1}).to_vector<double>()[1] == 5);
  CHECK(std::isnan(min(x, {1}).to_vector<double>()[0]));
  CHECK(min(x, {1}).to_vector<double>()[1] == -kInf);
  CHECK(std::isnan(sum(x).item<double>()));
  CHECK(std::isnan(logsumexp(x, {1}).to_vector<double>()[0]));
  CHECK(logsumexp(x, {1}).to_vector<double>()[1] == doctest::Approx(std::log(std::exp(2.) + std::exp(5.))));
  CHECK(logsumexp(f64({-kInf, -kInf}, {2})).item<double>() == -kInf);
  CHECK(logsumexp(f64({1, kInf}, {2})).item<double>() == kInf);
  CHECK(sum(f64({kInf, 1}, {2})).item<double>() == kInf);
  // Shifting by the maximum keeps large inputs finite.
  CHECK(logsumexp(f64({1000, 1000}, {2})).item<double>() == doctest::Approx(1000 + std::log(2.0)));
  CHECK(logsumexp(f64({1000, 1000}, {2}).to(DType::f32)).item<float>() == doctest::Approx(1000 + std::log(2.0)));
}

TEST_CASE("var and std do not overflow where the values and the result fit the dtype") {
  // The f32 sum of three f32 maxima overflows; the mean and the deviations do not.
  const float mx = std::numeric_limits<float>::max();
  const Tensor same = from_vector(std::vector<float>{mx, mx, mx}, Shape{3});
  CHECK(var(same).item<float>() == 0.0f);
  CHECK(kiln::std(same).item<float>() == 0.0f);
  // Squared deviations of 9.2e18 overflow f32 but their mean (about 3.4e37) does not.
  const std::int64_t big = std::numeric_limits<std::int64_t>::max();
  const Tensor ints = from_vector(std::vector<std::int64_t>{big, -big, big, -big}, Shape{4});
  CHECK(std::isfinite(var(ints).item<float>()));
  CHECK(var(ints).item<float>() == doctest::Approx(4.0 / 3.0 * 8.507059e37).epsilon(1e-5));
  const double dmx = std::numeric_limits<double>::max();
  CHECK(var(from_vector(std::vector<double>{dmx, dmx}, Shape{2})).item<double>() == 0.0);
}

TEST_CASE("std's f16 gradient stays finite where g times the deviation passes f16's max") {
  // x - mean is 32752 and g is 4: their product overflows f16, (x - mean) / std does not.
  Tensor x = from_vector(std::vector<float>{5.96e-8f, -65504.0f}, Shape{2}).to(DType::f16).requires_grad_();
  kiln::std(x, {0}).backward(full({}, 4.0, {.dtype = DType::f16}));
  const std::vector<float> g = x.grad().to_vector<float>();
  CHECK(g[0] == doctest::Approx(2.829).epsilon(3e-3));
  CHECK(g[1] == doctest::Approx(-2.829).epsilon(3e-3));
}

TEST_CASE("half precision accumulates in f32") {
  // Accumulating in f16 would stall at 2048 (2048 + 1 rounds back to 2048).
  const Tensor h = ones({10000}, {.dtype = DType::f16});
  CHECK(sum(h).dtype() == DType::f16);
  CHECK(sum(h).item<float>() == 10000.0f);
  CHECK(mean(h).item<float>() == 1.0f);
  const Tensor b = ones({100, 100}, {.dtype = DType::bf16});
  CHECK(mean(b).dtype() == DType::bf16);
  CHECK(mean(b).item<float>() == 1.0f);
  CHECK(sum(b, {1}).to_vector<float>() == std::vector<float>(100, 100.0f));
  CHECK(var(b).item<float>() == 0.0f);
  CHECK(max(h).dtype() == DType::f16);
  CHECK(logsumexp(ones({4}, {.dtype = DType::f16})).item<float>() == doctest::Approx(1 + std::log(4.0)).epsilon(1e-3));
}

TEST_CASE("integer and bool inputs: sums widen to i64, means become f32") {
  const Tensor i = from_vector(std::vector<std::int32_t>{2147483647, 1, 2}, Shape{3});
  CHECK(sum(i).dtype() == DType::i64);
  CHECK(sum(i).item<std::int64_t>() == 2147483650LL);
  CHECK(prod(i).dtype() == DType::i64);
  CHECK(prod(i).item<std::int64_t>() == 4294967294LL);
  CHECK(max(i).dtype() == DType::i32);
  CHECK(max(i).item<std::int32_t>() == 2147483647);
  CHECK(mean(i).dtype() == DType::f32);
  CHECK(var(i).dtype() == DType::f32);
  CHECK(logsumexp(from_vector(std::vector<std::int64_t>{0, 0}, Shape{2})).dtype() == DType::f32);
  CHECK(mean(from_vector(std::vector<std::int64_t>{1, 2}, Shape{2})).item<float>() == 1.5f);
  const Tensor b = from_vector(std::vector<bool>{true, false, true, true}, Shape{2, 2});
  CHECK(sum(b).dtype() == DType::i64);
  CHECK(sum(b).item<std::int64_t>() == 3);
  CHECK(sum(b, {0}).to_vector<std::int64_t>() == std::vector<std::int64_t>{2, 1});
  CHECK(max(b).dtype() == DType::boolean);
  CHECK(min(b, {1}).to_vector<bool>() == std::vector<bool>{false, true});
  const Tensor u = from_vector(std::vector<std::uint8_t>{200, 100}, Shape{2});
  CHECK(sum(u).item<std::int64_t>() == 300);
}

TEST_CASE("empty reductions: identities, NaN, or a ValueError naming the op") {
  const Tensor e = zeros({0}, {.dtype = DType::f64});
  CHECK(sum(e).item<double>() == 0);
  CHECK(prod(e).item<double>() == 1);
  CHECK(std::isnan(mean(e).item<double>()));
  CHECK(std::isnan(var(e).item<double>()));
  CHECK(logsumexp(e).item<double>() == -kInf);
  CHECK(sum(zeros({2, 0}), {1}).to_vector<float>() == std::vector<float>{0, 0});
  CHECK(sum(zeros({0, 3}), {1}).shape() == Shape{0});
  CHECK(max(zeros({0, 3}), {1}).shape() == Shape{0});
  for (const char* name : {"max", "min", "argmax", "argmin"}) {
    const std::string msg = message_of<ValueError>([&] { call(get_op(name), {zeros({2, 0})}, Attrs{{"axes", Axes{1}}}); });
    CHECK_MESSAGE(msg.find(std::string("[").append(name).append("]")) == 0, msg);
    CHECK_MESSAGE(msg.find("(2,0)") != std::string::npos, msg);
  }
}

TEST_CASE("bad axes throw ShapeError naming the op and the shape") {
  const Tensor x = zeros({2, 3});
  std::string msg = message_of<ShapeError>([&] { mean(x, {2}); });
  CHECK(msg.find("[mean]") == 0);
  CHECK(msg.find("(2,3)") != std::string::npos);
  msg = message_of<ShapeError>([&] { logsumexp(x, {-3}); });
  CHECK(msg.find("[logsumexp]") == 0);
  msg = message_of<ShapeError>([&] { sum(x, {1, -1}); });
  CHECK(msg.find("[sum]") == 0);
  CHECK(msg.find("twice") != std::string::npos);
  msg = message_of<ShapeError>([&] { argmin(x, 5); });
  CHECK(msg.find("[argmin]") == 0);
  CHECK_THROWS_AS(var(scalar_tensor(1.0), {1}), ShapeError);
}

TEST_CASE("reduction gradients match finite differences") {
  Generator gen(7);
  const Tensor x = rand({3, 4}, {.dtype = DType::f64}, &gen) + 0.5;
  const Tensor x3 = rand({2, 3, 2}, {.dtype = DType::f64}, &gen) - 0.5;
  using F = std::function<Tensor(const Tensor&)>;
  const std::vector<std::pair<std::string, F>> fns = {
      {"sum", [](const Tensor& t) { return sum(t, {1}, true); }},
      {"sum all", [](const Tensor& t) { return sum(t); }},
      {"mean", [](const Tensor& t) { return mean(t, {0}); }},
      {"mean all", [](const Tensor& t) { return mean(t); }},
      {"prod", [](const Tensor& t) { return prod(t, {1}); }},
      {"prod all", [](const Tensor& t) { return prod(t); }},
      {"max", [](const Tensor& t) { return max(t, {-1}); }},
      {"min all", [](const Tensor& t) { return min(t); }},
      {"var", [](const Tensor& t) { return var(t, {0}, true); }},
      {"var c0", [](const Tensor& t) { return var(t, all_axes(t), false, 0.0); }},
      {"std", [](const Tensor& t) { return kiln::std(t, {1}); }},
      {"std all", [](const Tensor& t) { return kiln::std(t); }},
      {"logsumexp", [](const Tensor& t) { return logsumexp(t, {0}); }},
      {"logsumexp all", [](const Tensor& t) { return logsumexp(t, all_axes(t), true); }},
  };
  for (const auto& named : fns)
    for (const Tensor& in : {x, x3}) {
      const F& f = named.second;  // named, not bound: clang 14 cannot capture bindings
      auto r = gradcheck([&](const auto& v) { return f(v[0]); }, {in});
      CHECK_MESSAGE(r.ok, named.first << " " << shape_str(in.shape()) << ": " << r.message);
    }
  auto r = gradcheck([](const auto& v) { return sum(v[0], {0, 2}) * mean(v[0], {1, 2}, false).reshape({2, 1}); }, {x3});
  CHECK_MESSAGE(r.ok, r.message);
}

TEST_CASE("prod gradients with zeros") {
  // One zero: only its position gets the product of the rest; two zeros: all zero.
  Tensor x = f64({2, 0, 3, 0, 0, 5}, {2, 3});
  x.requires_grad_();
  prod(x, {1}).backward(f64({1, 1}, {2}));
  CHECK(x.grad().to_vector<double>() == Values{0, 6, 0, 0, 0, 0});
  auto r = gradcheck([](const auto& v) { return prod(v[0], {1}); }, {f64({2, 0, 3, 1, 4, 5}, {2, 3})});
  CHECK_MESSAGE(r.ok, r.message);
}

TEST_CASE("prod gradients at edge values are the products of the other elements") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  auto grad_of = [](const Tensor& x) {
    Tensor leaf = x.detach().requires_grad_();
    prod(leaf, {-1}).backward(ones_like(prod(leaf, {-1})));
    return leaf.grad();
  };
  // f32: the row's product overflows (1e38 * 1e38 * 0.5), the gradients do not.
  Tensor big = from_vector<float>({1e38f, 1e38f, 0.5f}, {3});
  std::vector<float> g = grad_of(big).to_vector<float>();
  CHECK(g[0] == doctest::Approx(5e37f));
  CHECK(g[1] == doctest::Approx(5e37f));
  CHECK(std::isinf(g[2]));  // 1e76: really out of range
  // A partial product may overflow f32 while the gradient is finite: [1e30, 1e30, 1e-30, 1e-30].
  g = grad_of(from_vector<float>({1e30f, 1e30f, 1e-30f, 1e-30f}, {4})).to_vector<float>();
  CHECK(g[3] == doctest::Approx(1e30f));
  // inf and -inf: each gets the other times the rest; no NaN.
  std::vector<double> d = grad_of(f64({inf, -inf, 2}, {3})).to_vector<double>();
  CHECK(d == Values{-inf, inf, -inf});
  // Two zeros and a NaN: a zero's others hold the NaN; the NaN's others are two zeros.
  d = grad_of(f64({0, 0, nan}, {3})).to_vector<double>();
  CHECK(std::isnan(d[0]));
  CHECK(std::isnan(d[1]));
  CHECK(d[2] == 0);
  // One zero: only its position gets the product of the others.
  d = grad_of(f64({0, 3, 4}, {3})).to_vector<double>();
  CHECK(d == Values{12, 0, 0});
  // Over several axes, kept dims first in memory order or not.
  Tensor x = f64({1, 2, 3, 4, 5, 6, 0, 8, 9, 10, 11, 12}, {2, 3, 2});
  x.requires_grad_();
  prod(x, {0, 2}).backward(f64({1, 1, 1}, {3}));
  CHECK(x.grad().to_vector<double>() == Values{0, 0, 4 * 9 * 10, 3 * 9 * 10, 6 * 11 * 12, 5 * 11 * 12, 1 * 2 * 8, 0,
                                               3 * 4 * 10, 3 * 4 * 9, 5 * 6 * 12, 5 * 6 * 11});
}

TEST_CASE("max and min split the gradient evenly among ties") {
  Tensor x = f64({1, 3, 3, 2, 2, 0}, {2, 3});
  x.requires_grad_();
  max(x, {1}).backward(f64({1, 10}, {2}));
  CHECK(x.grad().to_vector<double>() == Values{0, 0.5, 0.5, 5, 5, 0});
  Tensor y = f64({4, 1, 1}, {3});
  y.requires_grad_();
  min(y).backward();
  CHECK(y.grad().to_vector<double>() == Values{0, 0.5, 0.5});
}

TEST_CASE("the registry's test hints pass gradcheck for every differentiable reduction") {
  for (const char* name : {"sum", "mean", "prod", "max", "min", "var", "std", "logsumexp"}) {
    const auto failures = kiln::testing::gradcheck_op(get_op(name));
    for (const auto& f : failures) FAIL_CHECK(f);
  }
  CHECK_FALSE(get_op("argmax").vjp);
  CHECK_FALSE(get_op("argmin").vjp);
  Tensor x = f64({1, 2}, {2});
  x.requires_grad_();
  CHECK_FALSE(argmax(x).requires_grad());
}
