// Shape and movement ops on the CPU: view layouts and storage sharing, slicing with steps,
// cat/stack/split/chunk, gather/index_select/scatter_add/one_hot, pad, errors, gradients.
#include <doctest/doctest.h>

#include "error_message.h"

#include <string>

#include "gradcheck.h"
#include "kiln/kiln.h"
#include "test_values.h"

using namespace kiln;
using kiln::testing::gradcheck;

namespace {
using kiln_test::i64;
using kiln_test::message_of;
using Ints = std::vector<std::int64_t>;

Tensor iota(Shape s, DType dt = DType::f32) { return arange(shape_numel(s), {.dtype = dt}).reshape(s); }
std::vector<float> vals(const Tensor& t) { return t.to_vector<float>(); }


Tensor rnd(Shape s, std::uint64_t seed) {
  Generator g(seed);
  return randn(s, {.dtype = DType::f64}, &g);
}
}  // namespace

TEST_CASE("permute, transpose, squeeze, unsqueeze and expand are views with the right strides") {
  Tensor x = iota({2, 3, 4});
  Tensor p = permute(x, {2, 0, 1});
  CHECK(p.shape() == Shape{4, 2, 3});
  CHECK(p.strides() == Shape{1, 12, 4});
  CHECK(p.shares_storage(x));
  CHECK(vals(p.contiguous())[1] == 4);  // p[0][0][1] = x[0][1][0]
  Tensor t = transpose(x, 0, -1);
  CHECK(t.shape() == Shape{4, 3, 2});
  CHECK(t.strides() == Shape{1, 4, 12});

  Tensor u = unsqueeze(x, 1);
  CHECK(u.shape() == Shape{2, 1, 3, 4});
  CHECK(u.strides() == Shape{12, 12, 4, 1});
  CHECK(unsqueeze(x, -1).shape() == Shape{2, 3, 4, 1});
  CHECK(squeeze(u).shape() == Shape{2, 3, 4});
  CHECK(squeeze(u, 1).strides() == Shape{12, 4, 1});
  CHECK(squeeze(u, 0).shape() == Shape{2, 1, 3, 4});  // size 2 stays, as torch.squeeze
  CHECK(squeeze(iota({1, 3, 1}), Ints{0, 2}).shape() == Shape{3});
  CHECK(unsqueeze(scalar_tensor(2.0), 0).shape() == Shape{1});

  Tensor e = expand(iota({3, 1}), {2, -1, 4});
  CHECK(e.shape() == Shape{2, 3, 4});
  CHECK(e.strides() == Shape{0, 1, 0});
  CHECK(vals(e.contiguous())[5] == 1);

  Tensor f = flatten(x, 1);
  CHECK(f.shape() == Shape{2, 12});
  CHECK(f.shares_storage(x));
  CHECK(flatten(x).shape() == Shape{24});
  CHECK(flatten(scalar_tensor(1.0)).shape() == Shape{1});
  Tensor ft = flatten(t, 0, 1);  // not viewable: copies
  CHECK(ft.shape() == Shape{12, 2});
  CHECK(vals(ft)[1] == 12);
}

TEST_CASE("views share storage and see writes both ways") {
  Tensor x = zeros({3, 4});
  Tensor v = slice(permute(x, {1, 0}), 0, 1, kEnd, 2);  // rows 1 and 3 of x^T
  v.fill_(7);
  CHECK(vals(x) == std::vector<float>{0, 7, 0, 7, 0, 7, 0, 7, 0, 7, 0, 7});
  x.add_(1.0);
  CHECK(vals(v) == std::vector<float>(6, 8));
  CHECK(v.version() == x.version());
  Tensor n = narrow(x, 1, 2, 1);
  n.zero_();
  CHECK(vals(x)[2] == 0);
  CHECK(vals(x)[3] == 8);
  Tensor c = contiguous(x);
  CHECK(c.is_same(x));
  CHECK_FALSE(contiguous(v).shares_storage(x));
}

TEST_CASE("slicing follows Python: steps, negative bounds, clamping, empty results") {
  Tensor x = iota({10});
  CHECK(vals(slice(x, 0, 1, 8, 3)) == std::vector<float>{1, 4, 7});
  CHECK(vals(slice(x, 0, -3)) == std::vector<float>{7, 8, 9});
  CHECK(vals(slice(x, 0, -100, 2)) == std::vector<float>{0, 1});
  CHECK(vals(slice(x, 0, 2, -5, 2)) == std::vector<float>{2, 4});
  CHECK(slice(x, 0, 8, 3).numel() == 0);
  CHECK(slice(x, 0, 20, 30).shape() == Shape{0});
  Tensor s = slice(x, 0, 1, kEnd, 4);
  CHECK(s.offset() == 1);
  CHECK(s.strides() == Shape{4});

  Tensor m = iota({4, 5});
  Tensor ms = slice(m, {{1, kEnd, 2}, {-1, -6, 1}});  // columns -1:-6 is empty
  CHECK(ms.shape() == Shape{2, 0});
  Tensor mm = slice(m, {{-3, -1}, {0, kEnd, 3}});
  CHECK(mm.shape() == Shape{2, 2});
  CHECK(mm.offset() == 5);
  CHECK(mm.strides() == Shape{5, 3});
  CHECK(vals(mm) == std::vector<float>{5, 8, 10, 13});
  CHECK(vals(narrow(m, -1, -2, 2)) == std::vector<float>{3, 4, 8, 9, 13, 14, 18, 19});
}

TEST_CASE("cat, stack, split and chunk") {
  Tensor a = iota({2, 2}), b = iota({2, 1}) + 10.0;
  Tensor c = cat({a, b}, 1);
  CHECK(c.shape() == Shape{2, 3});
  CHECK(vals(c) == std::vector<float>{0, 1, 10, 2, 3, 11});
  CHECK(vals(cat({a, permute(a, {1, 0})}, 0)) == std::vector<float>{0, 1, 2, 3, 0, 2, 1, 3});
  Tensor mixed = cat({iota({2}, DType::i32), iota({1}, DType::f64)});
  CHECK(mixed.dtype() == DType::f64);
  CHECK(mixed.to_vector<double>() == std::vector<double>{0, 1, 0});
  CHECK(cat({a, zeros({0, 2})}).shape() == Shape{2, 2});

  Tensor s = stack({a, a * 2.0}, 1);
  CHECK(s.shape() == Shape{2, 2, 2});
  CHECK(vals(s) == std::vector<float>{0, 1, 0, 2, 2, 3, 4, 6});
  CHECK(stack({a, a}, -1).shape() == Shape{2, 2, 2});

  Tensor x = iota({7, 2});
  auto parts = split(x, 3);
  REQUIRE(parts.size() == 3);
  CHECK(parts[2].shape() == Shape{1, 2});
  CHECK(parts[1].shares_storage(x));
  CHECK(parts[1].offset() == 6);
  auto sized = split(x, Ints{1, 6}, 0);
  CHECK(sized[1].shape() == Shape{6, 2});
  auto ch = chunk(x, 3, 0);  // torch.chunk: sizes 3, 3, 1
  REQUIRE(ch.size() == 3);
  CHECK(ch[0].shape() == Shape{3, 2});
  CHECK(ch[2].shape() == Shape{1, 2});
  CHECK(chunk(iota({6}), 4).size() == 3);  // size 2 each: only three chunks
  CHECK(vals(chunk(x, 2, 1)[1]) == std::vector<float>{1, 3, 5, 7, 9, 11, 13});
}

TEST_CASE("gather, index_select, scatter_add and one_hot") {
  Tensor x = iota({3, 4});
  Tensor g = gather(x, 1, i64({3, 0, 1, 1, 2, 2}, {3, 2}));
  CHECK(vals(g) == std::vector<float>{3, 0, 5, 5, 10, 10});
  CHECK(vals(gather(x, 0, i64({2, 0, 1}, {1, 3}))) == std::vector<float>{8, 1, 6});
  // i32 indices and a transposed input.
  Tensor gt = gather(permute(x, {1, 0}), 0, from_vector(std::vector<std::int32_t>{1, 3, 0}, {1, 3}));
  CHECK(vals(gt) == std::vector<float>{1, 7, 8});

  CHECK(vals(index_select(x, 0, i64({2, 0, 2}, {3}))) == std::vector<float>{8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11});
  CHECK(vals(index_select(x, -1, i64({3, 1}, {2}))) == std::vector<float>{3, 1, 7, 5, 11, 9});
  CHECK(index_select(x, 1, i64({}, {0})).shape() == Shape{3, 0});

  Tensor self = ones({2, 3});
  Tensor src = iota({2, 2}) + 1.0;  // 1 2 / 3 4
  Tensor r = scatter_add(self, 1, i64({0, 0, 2, 1}, {2, 2}), src);
  CHECK(vals(r) == std::vector<float>{4, 1, 1, 1, 5, 4});
  CHECK(vals(self) == std::vector<float>(6, 1));  // out of place
  // index smaller than src; duplicate targets along dim 0.
  Tensor r0 = scatter_add(zeros({2, 2}), 0, i64({1, 1}, {1, 2}), iota({2, 3}));
  CHECK(vals(r0) == std::vector<float>{0, 0, 0, 1});
  // f16 accumulates in f32: 2048 + 1 + 1 would round back to 2048 step by step in f16.
  Tensor h =
      scatter_add(full({1}, 2048.0, {.dtype = DType::f16}), 0, i64({0, 0}, {2}), ones({2}, {.dtype = DType::f16}));
  CHECK(h.to_vector<float>()[0] == 2050);
  Tensor ri = scatter_add(zeros({3}, {.dtype = DType::i64}), 0, i64({2, 2, 0}, {3}), i64({5, 6, 7}, {3}));
  CHECK(ri.to_vector<std::int64_t>() == std::vector<std::int64_t>{7, 0, 11});

  Tensor oh = one_hot(i64({2, 0, 1, 2}, {2, 2}), 3);
  CHECK(oh.dtype() == DType::i64);
  CHECK(oh.shape() == Shape{2, 2, 3});
  CHECK(oh.to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1});
  CHECK(one_hot(from_vector(std::vector<std::int32_t>{1}), 2).to_vector<std::int64_t>() ==
        std::vector<std::int64_t>{0, 1});
}

TEST_CASE("pad takes PyTorch's pad list from the last dim") {
  Tensor x = iota({2, 2}) + 1.0;
  Tensor p = pad(x, {1, 0, 0, 1}, -1.0);
  CHECK(p.shape() == Shape{3, 3});
  CHECK(vals(p) == std::vector<float>{-1, 1, 2, -1, 3, 4, -1, -1, -1});
  CHECK(vals(pad(permute(x, {1, 0}), {0, 1})) == std::vector<float>{1, 3, 0, 2, 4, 0});
  Tensor pi = pad(iota({2}, DType::i64), {2, 1}, 9);
  CHECK(pi.to_vector<std::int64_t>() == std::vector<std::int64_t>{9, 9, 0, 1, 9});
  CHECK(pad(x, {}).to_vector<float>() == vals(x));
}

TEST_CASE("bad dims, shapes and indices throw typed errors naming the op and shapes") {
  Tensor x = iota({2, 3});
  CHECK(message_of<ShapeError>([&] { permute(x, {0}); }).find("[permute]") != std::string::npos);
  CHECK(message_of<ShapeError>([&] { permute(x, {0, 0}); }).find("repeat") != std::string::npos);
  CHECK_THROWS_AS(transpose(x, 0, 2), ShapeError);
  CHECK_THROWS_AS(unsqueeze(x, 3), ShapeError);
  CHECK_THROWS_AS(expand(x, {3, 3}), ShapeError);
  CHECK_THROWS_AS(expand(x, {-1, 2, 3}), ShapeError);
  CHECK_THROWS_AS(slice(x, 0, 0, 2, 0), ValueError);
  CHECK_THROWS_AS(slice(scalar_tensor(1.0), 0, 0), ShapeError);
  CHECK(message_of<ValueError>([&] { narrow(x, 1, 2, 2); }).find("(2,3)") != std::string::npos);
  CHECK_THROWS_AS(flatten(x, 1, 0), ShapeError);

  std::string m = message_of<ShapeError>([&] { cat({x, iota({3, 3})}, 1); });
  CHECK(m.find("[cat]") != std::string::npos);
  CHECK(m.find("(2,3)") != std::string::npos);
  CHECK(m.find("(3,3)") != std::string::npos);
  CHECK_THROWS_AS(cat({}, 0), ValueError);
  CHECK_THROWS_AS(cat({x, iota({6})}), ShapeError);
  CHECK(message_of<ShapeError>([&] { stack({x, iota({3, 2})}); }).find("[stack]") != std::string::npos);
  CHECK_THROWS_AS(split(x, Ints{1, 2}, 0), ShapeError);
  CHECK_THROWS_AS(split(x, 0), ValueError);
  CHECK_THROWS_AS(chunk(x, 0), ValueError);

  m = message_of<ValueError>([&] { gather(x, 1, i64({0, 3}, {1, 2})); });
  CHECK(m.find("[gather]") != std::string::npos);
  CHECK(m.find("index 3") != std::string::npos);
  CHECK(message_of<ValueError>([&] { index_select(x, 0, i64({-1}, {1})); }).find("[index_select] index -1") !=
        std::string::npos);
  CHECK(message_of<ValueError>([&] {
          scatter_add(x, 0, i64({2}, {1, 1}), x);
        }).find("[scatter_add]") != std::string::npos);
  CHECK(message_of<ValueError>([&] { one_hot(i64({3}, {1}), 3); }).find("[one_hot]") != std::string::npos);
  CHECK_THROWS_AS(one_hot(i64({0}, {1}), 0), ValueError);
  CHECK(message_of<DTypeError>([&] { gather(x, 0, x); }).find("[gather] index must be") != std::string::npos);
  CHECK_THROWS_AS(one_hot(x, 3), DTypeError);
  CHECK(message_of<ShapeError>([&] { gather(x, 0, i64({0}, {1})); }).find("(2,3)") != std::string::npos);
  CHECK_THROWS_AS(gather(x, 0, i64({0, 0, 0, 0}, {1, 4})), ShapeError);
  CHECK_THROWS_AS(index_select(x, 0, i64({0, 0}, {1, 2})), ShapeError);
  CHECK_THROWS_AS(scatter_add(x, 0, i64({0, 0, 0}, {1, 3}), iota({1, 2})), ShapeError);
  CHECK_THROWS_AS(
      scatter_add(ones({2}, {.dtype = DType::boolean}), 0, i64({0}, {1}), ones({1}, {.dtype = DType::boolean})),
      DTypeError);

  CHECK(message_of<ShapeError>([&] { pad(x, {1, 1, 1}); }).find("[pad]") != std::string::npos);
  CHECK_THROWS_AS(pad(x, {1, 1, 1, 1, 1, 1}), ShapeError);
  CHECK_THROWS_AS(pad(x, {-1, 0}), ValueError);
}

TEST_CASE("gradients of the view ops match finite differences in f64") {
  Tensor x = rnd({2, 3, 4}, 1);
  auto check = [](const testing::SingleFn& f, const std::vector<Tensor>& in, const char* what) {
    auto r = gradcheck(f, in);
    CHECK_MESSAGE(r.ok, what << ": " << r.message);
  };
  check([](const auto& v) { return permute(v[0], {2, 0, 1}) * 1.5; }, {x}, "permute");
  check([](const auto& v) { return transpose(v[0], 0, 2); }, {x}, "transpose");
  check([](const auto& v) { return expand(v[0], {2, 3, -1}); }, {rnd({3, 1}, 2)}, "expand");
  check([](const auto& v) { return squeeze(unsqueeze(v[0], 1)) * unsqueeze(v[0], 0); }, {x}, "squeeze/unsqueeze");
  check([](const auto& v) { return flatten(transpose(v[0], 0, 1), 0, 1); }, {x}, "flatten");
  check(
      [](const auto& v) {
        return slice(v[0], {{1, kEnd, 2}, {-3, kEnd, 1}, {0, -1, 2}});
      },
      {rnd({4, 5, 3}, 3)}, "slice");
  check([](const auto& v) { return narrow(v[0], 2, 1, 2) * narrow(v[0], 2, 0, 2); }, {x}, "narrow");
  check([](const auto& v) { return contiguous(permute(v[0], {1, 0, 2})); }, {x}, "contiguous");
  check([](const auto& v) { return pad(v[0], {1, 2, 0, 3}, 0.5); }, {x}, "pad");
  check([](const auto& v) { return slice(pad(transpose(v[0], 0, 1), {2, 1}), 0, 1); }, {x}, "pad of a view");
}

TEST_CASE("gradients of cat, stack, split and chunk match finite differences in f64") {
  Tensor a = rnd({2, 3}, 4), b = rnd({2, 1}, 5), c = rnd({2, 3}, 6);
  auto check = [](const testing::MultiFn& f, const std::vector<Tensor>& in, const char* what) {
    auto r = gradcheck(f, in);
    CHECK_MESSAGE(r.ok, what << ": " << r.message);
  };
  check([](const auto& v) { return std::vector<Tensor>{cat({v[0], v[1], v[0]}, 1)}; }, {a, b}, "cat");
  check(
      [](const auto& v) {
        return std::vector<Tensor>{cat({permute(v[0], {1, 0}), permute(v[1], {1, 0})}, 0)};
      },
      {a, c}, "cat of a view");
  check([](const auto& v) { return std::vector<Tensor>{stack({v[0], v[1]}, 1)}; }, {a, c}, "stack");
  check([](const auto& v) { return split(v[0], 2, 1); }, {a}, "split");
  // Only one chunk is used: the others get no gradient (zeros).
  check([](const auto& v) { return std::vector<Tensor>{chunk(v[0], 2, 1)[1] * 2.0}; }, {a}, "chunk");
  check([](const auto& v) { return split(v[0], Ints{1, 1}, 0); }, {a}, "split by sizes");
}

TEST_CASE("gradients of gather, index_select and scatter_add match finite differences in f64") {
  Tensor x = rnd({3, 4}, 7);
  Tensor idx = i64({3, 0, 3, 1, 2, 2}, {3, 2});  // repeats: gradients accumulate
  auto check = [](const testing::SingleFn& f, const std::vector<Tensor>& in, const char* what) {
    auto r = gradcheck(f, in);
    CHECK_MESSAGE(r.ok, what << ": " << r.message);
  };
  check([&](const auto& v) { return gather(v[0], 1, idx); }, {x}, "gather");
  check([&](const auto& v) { return gather(permute(v[0], {1, 0}), 0, i64({1, 1, 0}, {1, 3})); }, {x}, "gather dim 0");
  check([&](const auto& v) { return index_select(v[0], 0, i64({2, 0, 2, 2}, {4})); }, {x}, "index_select");
  check([&](const auto& v) { return index_select(v[0], 1, i64({1, 3}, {2})); }, {x}, "index_select dim 1");
  check([&](const auto& v) { return scatter_add(v[0], 1, idx, v[1]); }, {x, rnd({3, 3}, 8)}, "scatter_add");
  check(
      [&](const auto& v) {
        return scatter_add(v[0], 0, i64({2, 2}, {1, 2}), v[1]);
      },
      {x, rnd({2, 2}, 9)}, "scatter_add with a small index");
  Tensor y = rnd({3}, 10);
  y.requires_grad_();
  sum(one_hot(i64({0}, {1}), 3) * y).backward();  // one_hot carries no gradient of its own
  CHECK(y.grad().to_vector<double>() == std::vector<double>{1, 0, 0});
}

TEST_CASE("slice_backward scatters a slice's gradient into zeros") {
  Tensor x = rnd({5, 2}, 11);
  x.requires_grad_();
  Tensor s = slice(x, 0, -4, kEnd, 2);
  CHECK(s.grad_fn()->name() == "slice");
  sum(s * 3.0).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 0, 3, 3, 0, 0, 3, 3, 0, 0});
}
