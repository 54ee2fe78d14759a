// NN functions on the CPU: softmax/log_softmax, nll_loss, cross_entropy (the fused
// softmax_cross_entropy op against the log_softmax + nll_loss composite), mse_loss,
// dropout, layer_norm and batch_norm against hand-computed values and independent loops,
// their errors, and gradient checks in f64.
#include <doctest/doctest.h>

#include "error_message.h"

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "kiln/kiln.h"
#include "test_values.h"

using namespace kiln;
using kiln::testing::gradcheck;

namespace {
using kiln_test::f64;
using kiln_test::i64;
using kiln_test::random_f64;
using kiln_test::message_of;


void check_within(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    CHECK_MESSAGE(std::abs(got[i] - want[i]) <= tol, "index ", i, ": ", got[i], " vs ", want[i]);
}


// Row-wise log-softmax of a row-major (N, C) block, in double.
std::vector<double> ref_log_softmax(const std::vector<double>& x, int n, int c) {
  std::vector<double> out(x.size());
  for (int i = 0; i < n; ++i) {
    double m = -INFINITY, s = 0;
    for (int k = 0; k < c; ++k) m = std::max(m, x[i * c + k]);
    for (int k = 0; k < c; ++k) s += std::exp(x[i * c + k] - m);
    for (int k = 0; k < c; ++k) out[i * c + k] = x[i * c + k] - m - std::log(s);
  }
  return out;
}


}  // namespace

TEST_CASE("softmax and log_softmax: values, rows summing to 1, any dim") {
  const std::vector<double> x{1, 2, 3, -1, 0, 4};
  Tensor t = f64(x, {2, 3});
  std::vector<double> lsm = ref_log_softmax(x, 2, 3), sm(6);
  for (int i = 0; i < 6; ++i) sm[i] = std::exp(lsm[i]);
  check_within(softmax(t, 1).to_vector<double>(), sm, 1e-14);
  check_within(log_softmax(t, -1).to_vector<double>(), lsm, 1e-14);
  check_within(sum(softmax(t, 0), {0}).to_vector<double>(), {1, 1, 1}, 1e-14);
  // dim 0 of (2, 3) is the row softmax of the transpose.
  std::vector<double> xt{1, -1, 2, 0, 3, 4};
  std::vector<double> col = ref_log_softmax(xt, 3, 2), got = log_softmax(t, 0).to_vector<double>();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) CHECK(got[i * 3 + j] == doctest::Approx(col[j * 2 + i]).epsilon(1e-12));
  // f32 and a zero-dim tensor.
  Tensor f = from_vector(std::vector<float>{0.5f, 0.25f, 2}, {3});
  CHECK(softmax(f).dtype() == DType::f32);
  CHECK(sum(softmax(f)).item<float>() == doctest::Approx(1.0f).epsilon(1e-6));
  CHECK(softmax(scalar_tensor(3.0)).item<double>() == 1.0);
}

TEST_CASE("softmax is stable for inputs of 1e4, and reads strided views") {
  Tensor t = from_vector(std::vector<float>{1e4f, 1e4f + 1, -1e4f}, {3});
  const double e = std::exp(1.0);
  check_within(std::vector<double>(softmax(t).to_vector<double>()), {1 / (1 + e), e / (1 + e), 0}, 1e-6);
  std::vector<double> l = log_softmax(t).to_vector<double>();
  CHECK(l[0] == doctest::Approx(-std::log1p(e)).epsilon(1e-5));
  CHECK(l[2] == doctest::Approx(-2e4 - 1 - std::log1p(1 / e)).epsilon(1e-6));
  for (double v : l) CHECK(std::isfinite(v));
  Tensor big = from_vector(std::vector<Half>{Half(1e4f), Half(1e4f), Half(-1e4f), Half(-1e4f)}, {2, 2});
  check_within(softmax(big, 1).to_vector<double>(), {0.5, 0.5, 0.5, 0.5}, 1e-3);
  // A transposed view: softmax over dim 1 of x^T is softmax over dim 0 of x.
  Tensor x = f64({1, 2, 3, 4, 5, 7}, {2, 3});
  Tensor xt = make_view(x, {3, 2}, {1, 3}, 0);
  std::vector<double> a = softmax(xt, 1).to_vector<double>(), b = softmax(x, 0).to_vector<double>();
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j) CHECK(a[i * 2 + j] == doctest::Approx(b[j * 3 + i]).epsilon(1e-14));
}

TEST_CASE("softmax errors are typed and name the op") {
  Tensor i = from_vector(std::vector<std::int32_t>{1, 2});
  CHECK(message_of<DTypeError>([&] { softmax(i); }).find("[softmax]") != std::string::npos);
  CHECK(message_of<ShapeError>([&] { log_softmax(f64({1, 2}, {2}), 3); }).find("[log_softmax]") != std::string::npos);
}

TEST_CASE("nll_loss gathers -log_probs at the labels, with ignore_index") {
  Tensor lp = f64({-0.1, -2, -3, -1.5, -0.5, -4}, {2, 3});
  Tensor labels = i64({0, 2}, {2});
  check_within(nll_loss(lp, labels, Reduction::none).to_vector<double>(), {0.1, 4}, 0);
  CHECK(nll_loss(lp, labels, Reduction::sum).item<double>() == doctest::Approx(4.1));
  CHECK(nll_loss(lp, labels).item<double>() == doctest::Approx(2.05));
  // Ignored elements count in neither the sum nor the mean's divisor.
  Tensor with_ignored = i64({-100, 1}, {2});
  check_within(nll_loss(lp, with_ignored, Reduction::none, -100).to_vector<double>(), {0, 0.5}, 0);
  CHECK(nll_loss(lp, with_ignored, Reduction::mean, -100).item<double>() == doctest::Approx(0.5));
  CHECK(std::isnan(nll_loss(lp, i64({-1, -1}, {2}), Reduction::mean, -1).item<double>()));
  // i32 labels and (N, C, d) log-probabilities.
  Tensor lp3 = f64({-1, -2, -3, -4, -5, -6, -7, -8}, {1, 2, 4});  // [n][c][d]
  Tensor l3 = from_vector(std::vector<std::int32_t>{1, 0, 0, 1}, {1, 4});
  check_within(nll_loss(lp3, l3, Reduction::none).to_vector<double>(), {5, 2, 3, 8}, 0);
}

TEST_CASE("nll_loss errors: labels out of range, dtypes, shapes") {
  Tensor lp = f64({-1, -2, -3, -4}, {2, 2});
  std::string m = message_of<ValueError>([&] { nll_loss(lp, i64({0, 5}, {2})); });
  CHECK(m.find("[nll_loss]") != std::string::npos);
  CHECK(m.find("label 5") != std::string::npos);
  CHECK_THROWS_AS(nll_loss(lp, i64({-1, 0}, {2})), ValueError);
  CHECK(message_of<DTypeError>([&] { nll_loss(lp, f64({0, 1}, {2})); }).find("[nll_loss]") != std::string::npos);
  CHECK(message_of<ShapeError>([&] { nll_loss(lp, i64({0, 1, 1}, {3})); }).find("(2,2)") != std::string::npos);
  CHECK_THROWS_AS(cross_entropy(lp, i64({0}, {1})), ShapeError);
  CHECK_THROWS_AS(cross_entropy(lp, i64({0, 1}, {2}), Reduction::mean, 1.0), ValueError);
}

TEST_CASE("cross_entropy against hand-computed values, with label smoothing and both reductions") {
  const std::vector<double> x{1, 2, 3, 0, 0, 0, -2, 5, 1};
  Tensor logits = f64(x, {3, 3});
  Tensor labels = i64({2, 1, 0}, {3});
  const std::vector<double> lsm = ref_log_softmax(x, 3, 3);
  const std::vector<std::int64_t> y{2, 1, 0};
  for (double eps : {0.0, 0.1, 0.4}) {
    std::vector<double> want(3);
    for (int i = 0; i < 3; ++i) {
      const double nll = -lsm[i * 3 + y[i]];
      const double uniform = -(lsm[i * 3] + lsm[i * 3 + 1] + lsm[i * 3 + 2]) / 3;
      want[i] = (1 - eps) * nll + eps * uniform;
    }
    check_within(cross_entropy(logits, labels, Reduction::none, eps).to_vector<double>(), want, 1e-12);
    CHECK(cross_entropy(logits, labels, Reduction::sum, eps).item<double>() ==
          doctest::Approx(want[0] + want[1] + want[2]).epsilon(1e-12));
    CHECK(cross_entropy(logits, labels, Reduction::mean, eps).item<double>() ==
          doctest::Approx((want[0] + want[1] + want[2]) / 3).epsilon(1e-12));
    // Ignoring the middle element drops both of its terms.
    Tensor ig = i64({2, 7, 0}, {3});
    CHECK(cross_entropy(logits, ig, Reduction::mean, eps, 7).item<double>() ==
          doctest::Approx((want[0] + want[2]) / 2).epsilon(1e-12));
  }
  // Known value: uniform logits give log(C).
  CHECK(cross_entropy(zeros({4, 5}), i64({0, 1, 2, 3}, {4})).item<float>() == doctest::Approx(std::log(5.0f)));
}

TEST_CASE("cross_entropy with every label ignored: a NaN mean, zero gradients, with or without smoothing") {
  for (double eps : {0.0, 0.1}) {
    Tensor logits = f64({0.5, -1, 2, 1, 0, -0.5}, {2, 3});
    logits.requires_grad_();
    Tensor loss = cross_entropy(logits, i64({-100, -100}, {2}), Reduction::mean, eps, -100);
    CHECK(std::isnan(loss.item<double>()));  // the mean of nothing, as PyTorch
    loss.backward();
    CHECK_MESSAGE(logits.grad().to_vector<double>() == std::vector<double>(6, 0.0), "smoothing " << eps);
  }
}

namespace {

// cross_entropy as it was before the fused op, written out: log_softmax, the nll gather,
// the smoothing term selected away on ignored rows, and the reduction.
Tensor composite_cross_entropy(const Tensor& logits, const Tensor& labels, Reduction r, double eps,
                               std::optional<std::int64_t> ignore) {
  const Tensor lp = log_softmax(logits, 1);
  Tensor loss = nll_loss(lp, labels, Reduction::none, ignore);
  Tensor valid = ones(labels.shape(), {.dtype = logits.dtype()});
  if (ignore) valid = where(ne(labels, Scalar(*ignore)), valid, Scalar(0));
  if (eps > 0) {
    const Tensor smooth = where(ne(valid, Scalar(0)), div(neg(sum(lp, {1})), double(logits.shape()[1])), Scalar(0));
    loss = add(mul(loss, 1 - eps), mul(smooth, eps));
  }
  if (r == Reduction::none) return loss;
  if (r == Reduction::sum) return sum(loss);
  return div(sum(loss), sum(valid));
}

const char* reduction_name(Reduction r) {
  return r == Reduction::none ? "none" : r == Reduction::sum ? "sum" : "mean";
}

}  // namespace

TEST_CASE("cross_entropy on (N, C) logits is one softmax_cross_entropy node") {
  Tensor logits = random_f64({5, 4}, 30);
  logits.requires_grad_();
  Tensor loss = cross_entropy(logits, i64({0, 3, 1, 1, 2}, {5}));
  REQUIRE(loss.grad_fn());
  CHECK(loss.grad_fn()->op().name == "softmax_cross_entropy");
  // (N, C, d) logits keep the composite.
  Tensor l3 = cross_entropy(random_f64({2, 3, 2}, 31).requires_grad_(), i64({0, 1, 2, 0}, {2, 2}));
  CHECK(l3.grad_fn()->op().name != "softmax_cross_entropy");
}

TEST_CASE("fused cross_entropy matches the composite: every dtype and reduction, smoothing, ignore_index") {
  // Against the composite in f64 on the same values: the fused op computes in f32 (f64 for
  // f64) and rounds once to the storage type, so the relative error is about one rounding.
  const std::pair<DType, double> dtypes[] = {{DType::f64, 1e-13}, {DType::f32, 1e-6}, {DType::f16, 1e-3},
                                             {DType::bf16, 8e-3}};
  const std::int64_t n = 37, c = 11;
  Generator gen(7);
  Tensor labels = randint(0, c, {n}, {}, &gen);
  // Every fourth label ignored (-100), and one ignore_index that is also a class (3).
  std::vector<std::int64_t> lv = labels.to_vector<std::int64_t>();
  for (std::size_t i = 0; i < lv.size(); i += 4) lv[i] = -100;
  Tensor with_ignored = i64(lv, {n});
  for (const auto& dt_tol : dtypes) {  // not a structured binding: clang 14 cannot capture one in INFO
    const DType dt = dt_tol.first;
    const double tol = dt_tol.second;
    Tensor x = random_f64({n, c}, 32, 3.0).to(dt);
    for (Reduction r : {Reduction::none, Reduction::sum, Reduction::mean})
      for (double eps : {0.0, 0.1, 0.35}) {
        struct Labelled {
          Tensor labels;
          std::optional<std::int64_t> ignore;
        };
        for (const Labelled& l : {Labelled{labels, std::nullopt}, Labelled{with_ignored, -100},
                                  Labelled{labels, std::int64_t{3}}}) {
          const Tensor fused = cross_entropy(x, l.labels, r, eps, l.ignore);
          const Tensor want = composite_cross_entropy(x.to(DType::f64), l.labels, r, eps, l.ignore);
          CHECK(fused.dtype() == dt);
          INFO(dtype_name(dt), " reduction=", reduction_name(r), " eps=", eps, " ignore=", l.ignore.value_or(0));
          const std::vector<double> got = fused.to_vector<double>(), w = want.to_vector<double>();
          REQUIRE(got.size() == w.size());
          for (std::size_t i = 0; i < w.size(); ++i)
            CHECK_MESSAGE(std::abs(got[i] - w[i]) <= tol * std::abs(w[i]), "index ", i, ": ", got[i], " vs ", w[i]);
        }
      }
  }
}

TEST_CASE("fused cross_entropy: gradients equal the composite's, and pass f64 finite differences") {
  Tensor x = random_f64({6, 5}, 33, 2.0);
  Tensor labels = i64({4, 0, 2, 2, 1, 3}, {6}), ignored = i64({4, -1, 2, -1, 1, 3}, {6});
  auto ok = [](const testing::GradcheckResult& r) { CHECK_MESSAGE(r.ok, r.message); };
  for (Reduction r : {Reduction::none, Reduction::sum, Reduction::mean})
    for (double eps : {0.0, 0.2}) {
      INFO("reduction=", reduction_name(r), " eps=", eps);
      ok(gradcheck([&](const auto& v) { return cross_entropy(v[0], labels, r, eps); }, {x}));
      ok(gradcheck([&](const auto& v) { return cross_entropy(v[0], ignored, r, eps, -1); }, {x}));
      Tensor a = x.clone().requires_grad_(), b = x.clone().requires_grad_();
      Tensor cot = r == Reduction::none ? random_f64({6}, 34) : scalar_tensor(1.5);
      cross_entropy(a, ignored, r, eps, -1).backward(cot);
      composite_cross_entropy(b, ignored, r, eps, -1).backward(cot);
      check_within(a.grad().to_vector<double>(), b.grad().to_vector<double>(), 1e-14);
    }
  // The op itself (its stats output is saved state: no gradient flows through it).
  const OpDef& op = get_op("softmax_cross_entropy");
  const Attrs attrs{{"reduction", std::string("mean")}, {"label_smoothing", 0.1}, {"ignore_index", std::int64_t{-1}}};
  ok(gradcheck([&](const auto& v) { return dispatch(op, {{v[0], ignored}}, attrs)[0]; }, {x}));
}

TEST_CASE("loss.backward() of cross_entropy takes the forward's gradient: the bits of the backward op's") {
  Generator gen(35);
  const std::int64_t n = 9, c = 7;
  const Tensor labels = randint(0, c, {n}, {}, &gen);
  struct Case {
    Reduction r;
    double eps;
    std::optional<std::int64_t> ignore;
  };
  for (DType t : {DType::f64, DType::f32, DType::bf16})
    for (const Case& k : {Case{Reduction::mean, 0.0, std::nullopt}, Case{Reduction::mean, 0.1, std::nullopt},
                          Case{Reduction::sum, 0.1, std::int64_t{2}}, Case{Reduction::mean, 0.1, std::int64_t{2}}}) {
      INFO(dtype_name(t), " reduction=", reduction_name(k.r), " eps=", k.eps, " ignore=", k.ignore.value_or(-1));
      const Tensor x = random_f64({n, c}, 36, 2.0).to(t);
      Tensor implicit = x.clone().requires_grad_(), given = x.clone().requires_grad_(),
             retained = x.clone().requires_grad_();
      const Tensor loss = cross_entropy(implicit, labels, k.r, k.eps, k.ignore);
      loss.backward();  // the forward's gradient where unit_grad was allowed
      cross_entropy(given, labels, k.r, k.eps, k.ignore).backward(ones({}, {.dtype = loss.dtype()}));
      cross_entropy(retained, labels, k.r, k.eps, k.ignore)
          .backward(Tensor(), true);  // a retained graph: the backward op
      CHECK(implicit.grad().to_vector<double>() == given.grad().to_vector<double>());
      CHECK(retained.grad().to_vector<double>() == given.grad().to_vector<double>());
    }
  // A loss that is the sum of two: the root's gradient is no longer backward()'s own 1 alone.
  Tensor a = random_f64({n, c}, 37).requires_grad_(), b = a.detach().clone().requires_grad_();
  const Tensor l = cross_entropy(a, labels);
  backward({l, l}, {}, false);
  cross_entropy(b, labels).backward(full({}, 2.0, {.dtype = DType::f64}));
  check_within(a.grad().to_vector<double>(), b.grad().to_vector<double>(), 1e-15);
}

TEST_CASE("softmax_cross_entropy saves each row's lse and the count; errors name the op") {
  const OpDef& op = get_op("softmax_cross_entropy");
  Tensor x = f64({1, 2, 3, 0, 0, 0}, {2, 3});
  const Attrs mean{{"reduction", std::string("mean")}, {"ignore_index", std::int64_t{7}}};
  std::vector<Tensor> out = dispatch(op, {{x, i64({2, 7}, {2})}}, mean);
  REQUIRE(out.size() == 3);
  CHECK(out[2].numel() == 0);  // no unit_grad asked for
  check_within(out[1].to_vector<double>(), {3 + std::log(1 + std::exp(-1.0) + std::exp(-2.0)), std::log(3.0), 1}, 1e-14);
  CHECK(out[0].item<double>() == doctest::Approx(std::log(1 + std::exp(-1.0) + std::exp(-2.0))).epsilon(1e-14));
  // f16 logits keep the stats in f32.
  std::vector<Tensor> half = dispatch(op, {{x.to(DType::f16), i64({2, 1}, {2})}}, mean);
  CHECK(half[0].dtype() == DType::f16);
  CHECK(half[1].dtype() == DType::f32);
  std::string m = message_of<ValueError>([&] { cross_entropy(x, i64({0, 3}, {2})); });
  CHECK(m.find("[softmax_cross_entropy] label 3 is out of range for 3 classes") != std::string::npos);
  CHECK(message_of<DTypeError>([&] { cross_entropy(x, f64({0, 1}, {2})); }).find("[softmax_cross_entropy]") !=
        std::string::npos);
  CHECK(message_of<ValueError>([&] { dispatch(op, {{x, i64({0, 1}, {2})}}, Attrs{{"reduction", std::string("max")}}); })
            .find("[softmax_cross_entropy] reduction must be none, sum or mean") != std::string::npos);
  CHECK(message_of<ShapeError>([&] { dispatch(op, {{x, i64({0, 1, 1}, {3})}}, mean); })
            .find("[softmax_cross_entropy] needs logits (N, C) and labels (N)") != std::string::npos);
  CHECK(message_of<ValueError>([&] {
          dispatch(op, {{x, i64({0, 1}, {2})}},
                   Attrs{{"reduction", std::string("mean")}, {"ignore_index", std::int64_t{7}}, {"unit_grad", true}});
        }).find("[softmax_cross_entropy] unit_grad needs reduction sum, or mean with no ignore_index") !=
        std::string::npos);
  // cross_entropy's own checks come first, with today's messages.
  CHECK(message_of<ShapeError>([&] { cross_entropy(x, i64({0}, {1})); }).find("[cross_entropy]") != std::string::npos);
  CHECK(message_of<ValueError>([&] { cross_entropy(x, i64({0, 1}, {2}), Reduction::mean, 1.0); })
            .find("[cross_entropy] label_smoothing must be in [0, 1)") != std::string::npos);
}

TEST_CASE("mse_loss reduces the squared difference") {
  Tensor a = f64({1, 2, 3, 4}, {2, 2}), b = f64({1, 0, 5, 1}, {2, 2});
  check_within(mse_loss(a, b, Reduction::none).to_vector<double>(), {0, 4, 4, 9}, 0);
  CHECK(mse_loss(a, b, Reduction::sum).item<double>() == 17);
  CHECK(mse_loss(a, b).item<double>() == 4.25);
  CHECK_THROWS_AS(mse_loss(a, f64({1, 2}, {2})), ShapeError);
  CHECK_THROWS_AS(mse_loss(i64({1}, {1}), i64({1}, {1})), DTypeError);
}

TEST_CASE("dropout: statistics, scaling, determinism by seed, eval identity") {
  const double p = 0.3;
  Tensor x = ones({200000});
  Generator g1(42), g2(42), g3(43);
  Tensor y = dropout(x, p, true, &g1);
  std::vector<float> v = y.to_vector<float>();
  std::int64_t zeros_seen = 0;
  for (float e : v) {
    if (e == 0)
      ++zeros_seen;
    else
      CHECK_MESSAGE(e == doctest::Approx(1 / (1 - p)).epsilon(1e-6), e);
  }
  CHECK(static_cast<double>(zeros_seen) / v.size() == doctest::Approx(p).epsilon(0.02));
  CHECK(sum(y).item<float>() / v.size() == doctest::Approx(1.0).epsilon(0.01));
  CHECK(dropout(x, p, true, &g2).to_vector<float>() == v);
  CHECK(dropout(x, p, true, &g3).to_vector<float>() != v);
  CHECK(dropout(x, p, false, &g1).is_same(x));
  CHECK(dropout(x, 0.0, true, &g1).is_same(x));
  CHECK(sum(dropout(x, 1.0, true, &g1)).item<float>() == 0);
  CHECK_THROWS_AS(dropout(x, 1.5), ValueError);
  // The gradient is mask / (1 - p): the output itself for x = 1.
  Tensor leaf = ones({64}, {.requires_grad = true});
  Generator g4(5);
  Tensor out = dropout(leaf, 0.5, true, &g4);
  sum(out).backward();
  CHECK(leaf.grad().to_vector<float>() == out.to_vector<float>());
}

TEST_CASE("layer_norm matches independent loops, with weight and bias") {
  Tensor x = random_f64({3, 2, 4}, 1, 3.0);
  Tensor w = random_f64({2, 4}, 2), b = random_f64({2, 4}, 3);
  const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>(), bv = b.to_vector<double>();
  std::vector<double> want(xv.size());
  for (int r = 0; r < 3; ++r) {
    double m = 0, var = 0;
    for (int k = 0; k < 8; ++k) m += xv[r * 8 + k] / 8;
    for (int k = 0; k < 8; ++k) var += (xv[r * 8 + k] - m) * (xv[r * 8 + k] - m) / 8;
    for (int k = 0; k < 8; ++k) want[r * 8 + k] = (xv[r * 8 + k] - m) / std::sqrt(var + 1e-5) * wv[k] + bv[k];
  }
  check_within(layer_norm(x, {2, 4}, w, b).to_vector<double>(), want, 1e-12);
  Tensor y = layer_norm(x, {4});
  check_within(sum(y, {2}).to_vector<double>(), std::vector<double>(6, 0.0), 1e-12);
  Tensor h = layer_norm(x.to(DType::f16), {2, 4}, w.to(DType::f16), b.to(DType::f16));
  CHECK(h.dtype() == DType::f16);
  check_within(h.to_vector<double>(), want, 0.02);
  CHECK_THROWS_AS(layer_norm(x, {3}), ShapeError);
  CHECK_THROWS_AS(layer_norm(x, {4}, ones({3})), ShapeError);
}

TEST_CASE("batch_norm in training and eval mode, with running statistics") {
  const int n = 3, c = 2, hw = 4;
  Tensor x = random_f64({n, c, 2, 2}, 7, 2.0);
  Tensor w = f64({1.5, -0.5}, {2}), b = f64({0.25, 1}, {2});
  Tensor rm = f64({0.5, -1}, {2}), rv = f64({2, 0.5}, {2});
  const std::vector<double> xv = x.to_vector<double>();
  auto at = [&](int i, int ch, int k) { return xv[(i * c + ch) * hw + k]; };
  std::vector<double> want_train(xv.size()), want_eval(xv.size()), new_rm(2), new_rv(2);
  const double wv[] = {1.5, -0.5}, bv[] = {0.25, 1}, rmv[] = {0.5, -1}, rvv[] = {2, 0.5};
  for (int ch = 0; ch < c; ++ch) {
    double m = 0, var = 0;
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < hw; ++k) m += at(i, ch, k) / (n * hw);
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < hw; ++k) var += (at(i, ch, k) - m) * (at(i, ch, k) - m);
    const double biased = var / (n * hw), unbiased = var / (n * hw - 1);
    new_rm[ch] = 0.9 * rmv[ch] + 0.1 * m;
    new_rv[ch] = 0.9 * rvv[ch] + 0.1 * unbiased;
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < hw; ++k) {
        want_train[(i * c + ch) * hw + k] = (at(i, ch, k) - m) / std::sqrt(biased + 1e-5) * wv[ch] + bv[ch];
        want_eval[(i * c + ch) * hw + k] = (at(i, ch, k) - rmv[ch]) / std::sqrt(rvv[ch] + 1e-5) * wv[ch] + bv[ch];
      }
  }
  check_within(batch_norm(x, rm, rv, w, b, false).to_vector<double>(), want_eval, 1e-12);
  CHECK(rm.to_vector<double>() == std::vector<double>{0.5, -1});  // eval leaves them alone
  const std::uint64_t before = rm.version();
  check_within(batch_norm(x, rm, rv, w, b, true, 0.1).to_vector<double>(), want_train, 1e-12);
  CHECK(rm.version() > before);
  check_within(rm.to_vector<double>(), new_rm, 1e-12);
  check_within(rv.to_vector<double>(), new_rv, 1e-12);
  // f16 input and running statistics: normalised in f32, updated in place in f16.
  Tensor rm16 = rm.to(DType::f16), rv16 = rv.to(DType::f16);
  Tensor y16 = batch_norm(x.to(DType::f16), rm16, rv16, w, b, true, 0.1);
  CHECK(y16.dtype() == DType::f16);  // half inputs come back in their dtype
  check_within(y16.to_vector<double>(), want_train, 0.02);
  CHECK(rm16.dtype() == DType::f16);
  check_within(rm16.to_vector<double>(),
              {0.9 * new_rm[0] + 0.1 * (new_rm[0] - 0.9 * 0.5) / 0.1, 0.9 * new_rm[1] + 0.1 * (new_rm[1] + 0.9) / 0.1},
              0.01);
  // (N, C) input, no running statistics, no affine parameters.
  Tensor x2 = f64({1, 10, 3, 30}, {2, 2});
  check_within(batch_norm(x2, {}, {}, {}, {}, true).to_vector<double>(), {-1, -1, 1, 1}, 1e-4);
  CHECK_THROWS_AS(batch_norm(x2, {}, {}, {}, {}, false), ValueError);
  CHECK_THROWS_AS(batch_norm(x2, ones({3}), ones({3})), ShapeError);
  CHECK_THROWS_AS(batch_norm(f64({1, 2}, {1, 2}), {}, {}, {}, {}, true), ValueError);
}

TEST_CASE("gradient checks in f64: softmax, log_softmax, losses and norms") {
  Tensor x = random_f64({3, 5}, 11, 2.0);
  Tensor x4 = random_f64({2, 3, 2, 2}, 12);
  Tensor labels = i64({4, 0, 2}, {3});
  auto ok = [](const testing::GradcheckResult& r) { CHECK_MESSAGE(r.ok, r.message); };
  ok(gradcheck([](const auto& v) { return softmax(v[0], 1); }, {x}));
  ok(gradcheck([](const auto& v) { return softmax(v[0], 0); }, {x}));
  ok(gradcheck([](const auto& v) { return log_softmax(v[0], -1); }, {x}));
  ok(gradcheck([](const auto& v) { return log_softmax(v[0], 1); }, {x4}));
  ok(gradcheck([&](const auto& v) { return cross_entropy(v[0], labels); }, {x}));
  ok(gradcheck([&](const auto& v) { return cross_entropy(v[0], labels, Reduction::sum, 0.2); }, {x}));
  ok(gradcheck(
      [&](const auto& v) {
        return cross_entropy(v[0], i64({4, -100, 2}, {3}), Reduction::none, 0.1, -100);
      },
      {x}));
  ok(gradcheck([&](const auto& v) { return nll_loss(v[0], labels, Reduction::none); }, {x}));
  ok(gradcheck(
      [&](const auto& v) {
        return nll_loss(v[0], i64({1, 0, 2, 2, 1, 0, 0, 1}, {2, 2, 2}), Reduction::mean);
      },
      {x4}));
  ok(gradcheck([](const auto& v) { return mse_loss(v[0], v[1]); }, {x, random_f64({3, 5}, 13)}));
  ok(gradcheck([](const auto& v) { return layer_norm(v[0], {5}, v[1], v[2]); },
               {x, random_f64({5}, 14), random_f64({5}, 15)}));
  ok(gradcheck([](const auto& v) { return layer_norm(v[0], {2, 2}); }, {x4}));
  ok(gradcheck([](const auto& v) { return batch_norm(v[0], {}, {}, v[1], v[2], true); },
               {x4, random_f64({3}, 16), random_f64({3}, 17)}));
  ok(gradcheck([](const auto& v) { return batch_norm(v[0], {}, {}, {}, {}, true); }, {x}));
  Tensor rm = zeros({5}, {.dtype = DType::f64}), rv = ones({5}, {.dtype = DType::f64});
  ok(gradcheck([&](const auto& v) { return batch_norm(v[0], rm, rv, v[1], {}, false); }, {x, random_f64({5}, 18)}));
  for (const char* op : {"softmax", "log_softmax"})
    for (const std::string& f : testing::gradcheck_op(get_op(op))) FAIL(f);
}
