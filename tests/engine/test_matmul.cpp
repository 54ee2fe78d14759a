// matmul and linear on the CPU: against naive loops (vectors, batches with broadcasting,
// transposed views, every floating dtype), errors, and gradient checks in f64.
#include <doctest/doctest.h>

#include "error_message.h"

#include <cmath>
#include <string>

#include "core/registry.h"
#include "gradcheck.h"
#include "kiln/kiln.h"
#include "test_values.h"

using namespace kiln;

namespace {
using kiln_test::random_f64;
using kiln_test::check_close;
using kiln_test::message_of;



// (.., m, k) @ (.., k, n) with the batch dims broadcast, by index arithmetic on flat values.
std::vector<double> naive(const std::vector<double>& a, const Shape& as, const std::vector<double>& b, const Shape& bs,
                          Shape& out_shape) {
  const std::size_t nb = std::max(as.size(), bs.size()) - 2;
  Shape batch(nb);
  auto dim_of = [&](const Shape& s, std::size_t i) {  // batch dim i, right-aligned; 1 when absent
    const std::size_t off = nb - (s.size() - 2);
    return i < off ? std::int64_t{1} : s[i - off];
  };
  for (std::size_t i = 0; i < nb; ++i) batch[i] = dim_of(as, i) == 1 ? dim_of(bs, i) : dim_of(as, i);
  const std::int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  out_shape = batch;
  out_shape.push_back(m);
  out_shape.push_back(n);
  std::vector<double> out(static_cast<std::size_t>(shape_numel(out_shape)));
  std::int64_t batches = shape_numel(batch);
  for (std::int64_t bi = 0; bi < batches; ++bi) {
    std::int64_t rem = bi, ia = 0, ib = 0, sa = 1, sb = 1;
    for (std::size_t d = nb; d-- > 0;) {
      const std::int64_t idx = rem % batch[d];
      rem /= batch[d];
      if (dim_of(as, d) != 1) ia += idx * sa;
      if (dim_of(bs, d) != 1) ib += idx * sb;
      sa *= dim_of(as, d);
      sb *= dim_of(bs, d);
    }
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::int64_t p = 0; p < k; ++p) s += a[(ia * m + i) * k + p] * b[(ib * k + p) * n + j];
        out[(bi * m + i) * n + j] = s;
      }
  }
  return out;
}


// The last two dims swapped, as a view of the same storage.
Tensor transposed(const Tensor& t) {
  Shape sh = t.shape(), st = t.strides();
  std::swap(sh[sh.size() - 1], sh[sh.size() - 2]);
  std::swap(st[st.size() - 1], st[st.size() - 2]);
  return make_view(t, sh, st, t.offset());
}

}  // namespace

TEST_CASE("matmul of small matrices and vectors, by hand") {
  Tensor a = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = from_vector(std::vector<float>{7, 8, 9, 10, 11, 12}, {3, 2});
  Tensor c = matmul(a, b);
  CHECK(c.shape() == Shape{2, 2});
  CHECK(c.to_vector<float>() == std::vector<float>{58, 64, 139, 154});

  Tensor v3 = from_vector(std::vector<float>{1, 0, -1});
  Tensor v2 = from_vector(std::vector<float>{1, -1});
  CHECK(matmul(a, v3).shape() == Shape{2});
  CHECK(matmul(a, v3).to_vector<float>() == std::vector<float>{-2, -2});
  CHECK(matmul(v2, a).shape() == Shape{3});
  CHECK(matmul(v2, a).to_vector<float>() == std::vector<float>{-3, -3, -3});
  Tensor dot = matmul(v3, from_vector(std::vector<float>{4, 5, 6}));
  CHECK(dot.dim() == 0);
  CHECK(dot.item<float>() == -2);
  // A batched matrix times a vector, and a vector times a batch.
  Tensor batch = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {2, 2, 3});
  CHECK(matmul(batch, v3).shape() == Shape{2, 2});
  CHECK(matmul(batch, v3).to_vector<float>() == std::vector<float>{-2, -2, -2, -2});
  CHECK(matmul(v2, batch).shape() == Shape{2, 3});
  CHECK(matmul(v2, batch).to_vector<float>() == std::vector<float>{-3, -3, -3, -3, -3, -3});
}

TEST_CASE("matmul with broadcast batch dims matches naive loops") {
  const std::vector<std::pair<Shape, Shape>> cases = {{{4, 5}, {5, 3}},
                                                      {{2, 4, 5}, {2, 5, 3}},
                                                      {{2, 4, 5}, {5, 3}},
                                                      {{4, 5}, {3, 5, 2}},
                                                      {{2, 1, 3, 4}, {5, 4, 2}},
                                                      {{3, 1, 2, 3}, {1, 4, 3, 2}},
                                                      {{1, 3, 1, 2}, {2, 1, 1, 2, 4}},
                                                      {{3, 0, 4}, {4, 2}},
                                                      {{2, 3, 0}, {0, 5}},
                                                      {{0, 2, 3}, {3, 4}},
                                                      {{2, 1, 2, 3}, {0, 3, 4}}};
  std::uint64_t seed = 1;
  for (const auto& item : cases) {
    const auto& as = item.first;  // named, not bound: clang 14 cannot capture bindings
    const auto& bs = item.second;
    Tensor a = random_f64(as, seed++), b = random_f64(bs, seed++);
    Shape want_shape;
    auto want = naive(a.to_vector<double>(), as, b.to_vector<double>(), bs, want_shape);
    Tensor c = matmul(a, b);
    INFO(shape_str(as) << " @ " << shape_str(bs));
    CHECK(c.shape() == want_shape);
    check_close(c.to_vector<double>(), want, 1e-12);
  }
}

TEST_CASE("matmul in every floating dtype and through transposed and strided views") {
  Tensor a = random_f64({3, 4, 6}, 11), b = random_f64({6, 5}, 12);
  Shape s;
  auto want = naive(a.to_vector<double>(), a.shape(), b.to_vector<double>(), b.shape(), s);
  for (auto item : {std::pair{DType::f32, 1e-5}, {DType::f64, 1e-12}, {DType::f16, 1e-2}, {DType::bf16, 5e-2}}) {
    const auto dt = item.first;  // named, not bound: clang 14 cannot capture bindings
    const auto tol = item.second;
    INFO(dtype_name(dt));
    Tensor c = matmul(a.to(dt), b.to(dt));
    CHECK(c.dtype() == dt);
    check_close(c.to(DType::f64).to_vector<double>(), want, tol);
  }
  // Views: a^T stored as (.., 6, 4) transposed back, b^T the same; results equal.
  Tensor at = transposed(transposed(a).contiguous());
  Tensor bt = transposed(transposed(b).contiguous());
  CHECK_FALSE(at.is_contiguous());
  check_close(matmul(at, bt).to_vector<double>(), want, 1e-12);
  // A batch that broadcasts through a zero stride, and a mixed-dtype pair promotes.
  Tensor b_exp = broadcast_to(b, {3, 6, 5});
  check_close(matmul(a, b_exp).to_vector<double>(), want, 1e-12);
  CHECK(matmul(a.to(DType::f32), b).dtype() == DType::f64);
}

TEST_CASE("matmul and linear report bad shapes and dtypes") {
  Tensor a = zeros({3, 4}), b = zeros({5, 6});
  CHECK(message_of<ShapeError>([&] { matmul(a, b); }) == "[matmul] shapes (3,4) and (5,6) cannot be multiplied");
  CHECK_THROWS_AS(matmul(zeros({}), a), ShapeError);
  CHECK_THROWS_AS(matmul(zeros({2, 3, 4}), zeros({3, 4, 2})), ShapeError);  // batch 2 vs 3
  CHECK_THROWS_AS(matmul(zeros({4}), zeros({3})), ShapeError);
  CHECK_THROWS_AS(matmul(ones({2, 2}, {.dtype = DType::i32}), ones({2, 2}, {.dtype = DType::i32})), DTypeError);

  Tensor w = zeros({5, 4});
  CHECK(linear(zeros({2, 4}), w).shape() == Shape{2, 5});
  CHECK(message_of<ShapeError>([&] { linear(zeros({2, 3}), w); }).starts_with("[linear] input of shape (2,3)"));
  CHECK(message_of<ShapeError>([&] { linear(zeros({2, 4}), zeros({5})); }).starts_with("[linear] weight must be 2-D"));
  CHECK(message_of<ShapeError>([&] { linear(zeros({2, 4}), w, zeros({4})); }).starts_with("[linear] bias must"));
}

TEST_CASE("linear is x @ w^T + b") {
  Tensor x = from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
  Tensor w = from_vector(std::vector<float>{1, 0, 1, 1, 0, 2}, {3, 2});
  Tensor bias = from_vector(std::vector<float>{10, 20, 30});
  CHECK(linear(x, w).to_vector<float>() == std::vector<float>{1, 3, 4, 3, 7, 8});
  CHECK(linear(x, w, bias).to_vector<float>() == std::vector<float>{11, 23, 34, 13, 27, 38});
  CHECK(linear(from_vector(std::vector<float>{1, 2}), w, bias).to_vector<float>() == std::vector<float>{11, 23, 34});
}

TEST_CASE("linear_grads is gp^T @ x and gp's column sums, by hand, in every floating dtype") {
  // gp (3, 2), x (3, 2): dW[i][j] = sum over rows r of gp[r][i] * x[r][j]; db[i] = sum of gp[.][i].
  const std::vector<double> gp{1, 2, 3, 4, 5, 6}, x{1, 0, 2, 1, 0, 3};
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(t));
    const LinearGrads g = linear_grads(from_vector(gp, {3, 2}).to(t), from_vector(x, {3, 2}).to(t));
    CHECK(g.weight.shape() == Shape{2, 2});
    CHECK(g.bias.shape() == Shape{2});
    CHECK(g.weight.to(DType::f64).to_vector<double>() == std::vector<double>{7, 18, 10, 22});
    CHECK(g.bias.to(DType::f64).to_vector<double>() == std::vector<double>{9, 12});
  }
  CHECK(message_of<ShapeError>([] { (void)linear_grads(zeros({3, 2}), zeros({4, 2})); }).find("linear_grad") !=
        std::string::npos);
  CHECK(message_of<ShapeError>([] {
          (void)linear_grads(zeros({3, 2}, {.dtype = DType::f64}), zeros({4, 2}, {.dtype = DType::f64}));
        }).find("linear_grads") != std::string::npos);
}

TEST_CASE("allow_tf32 is opt-in") {
  CHECK_FALSE(allow_tf32());
  set_allow_tf32(true);
  CHECK(allow_tf32());
  set_allow_tf32(false);
  CHECK_FALSE(allow_tf32());
}

TEST_CASE("matmul and linear gradients match finite differences") {
  using testing::gradcheck;
  auto mm = [](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); };
  const std::vector<std::pair<Shape, Shape>> cases = {{{3, 4}, {4, 2}}, {{2, 3, 4}, {4, 2}}, {{2, 1, 3, 2}, {3, 2, 2}},
                                                      {{4}, {4, 3}},    {{3, 4}, {4}},       {{4}, {4}},
                                                      {{2, 3, 4}, {4}}};
  std::uint64_t seed = 40;
  for (const auto& item : cases) {
    const auto& as = item.first;  // named, not bound: clang 14 cannot capture bindings
    const auto& bs = item.second;
    INFO(shape_str(as) << " @ " << shape_str(bs));
    auto r = gradcheck(mm, {random_f64(as, seed++), random_f64(bs, seed++)});
    CHECK_MESSAGE(r.ok, r.message);
  }
  auto lin = [](const std::vector<Tensor>& x) { return linear(x[0], x[1], x[2]); };
  auto r = gradcheck(lin, {random_f64({2, 3, 4}, 50), random_f64({5, 4}, 51), random_f64({5}, 52)});
  CHECK_MESSAGE(r.ok, r.message);
  auto failures = testing::gradcheck_op(get_op("matmul"));
  CHECK_MESSAGE(failures.empty(), (failures.empty() ? "" : failures[0]));
}
