// The core ops on the CPU: broadcasting, scalar operands, sum, and their errors.
#include <doctest/doctest.h>

#include "error_message.h"

#include <cmath>
#include <string>

#include "core/registry.h"
#include "kiln/kiln.h"
#include "test_values.h"

using namespace kiln;

namespace {
using kiln_test::f32;
using kiln_test::message_of;

}  // namespace

TEST_CASE("binary ops broadcast like NumPy") {
  Tensor a = f32({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor row = f32({10, 20, 30}, {3});
  Tensor col = f32({100, 200}, {2, 1});
  CHECK((a + row).to_vector<float>() == std::vector<float>{11, 22, 33, 14, 25, 36});
  CHECK((a - col).to_vector<float>() == std::vector<float>{-99, -98, -97, -196, -195, -194});
  CHECK((row * col).shape() == Shape{2, 3});
  CHECK((row * col).to_vector<float>() == std::vector<float>{1000, 2000, 3000, 2000, 4000, 6000});
  CHECK((a / f32({2}, {})).to_vector<float>() == std::vector<float>{0.5, 1, 1.5, 2, 2.5, 3});
  CHECK((-a).to_vector<float>()[5] == -6);
  CHECK(broadcast_shapes({5, 1, 4}, {3, 1}, "t") == Shape{5, 3, 4});
  CHECK(broadcast_shapes({}, {2}, "t") == Shape{2});
}

TEST_CASE("scalar operands and reversed scalars") {
  Tensor a = f32({1, 2, 4}, {3});
  CHECK((a + 1).to_vector<float>() == std::vector<float>{2, 3, 5});
  CHECK((1 - a).to_vector<float>() == std::vector<float>{0, -1, -3});
  CHECK((a - 1).to_vector<float>() == std::vector<float>{0, 1, 3});
  CHECK((2 * a).to_vector<float>() == std::vector<float>{2, 4, 8});
  CHECK((4 / a).to_vector<float>() == std::vector<float>{4, 2, 1});
  CHECK((a / 4).to_vector<float>() == std::vector<float>{0.25, 0.5, 1});
  Tensor i = from_vector(std::vector<std::int32_t>{7, -7});
  CHECK((i / 2).to_vector<float>() == std::vector<float>{3.5, -3.5});
  CHECK((i * 3).to_vector<std::int32_t>() == std::vector<std::int32_t>{21, -21});
  Tensor u = from_vector(std::vector<std::uint8_t>{250, 3});
  CHECK((u + 10).to_vector<std::int32_t>() == std::vector<std::int32_t>{4, 13});  // u8 wraps
  CHECK((u - 4).to_vector<std::int32_t>() == std::vector<std::int32_t>{246, 255});
}

TEST_CASE("f16 and bf16 compute in f32 and round once") {
  Tensor h = from_vector(std::vector<float>{1, 2048}, {2}, {.dtype = DType::f16});
  // 2048 + 1 is not representable in f16: rounds to even (2048).
  CHECK((h + 1).to_vector<float>() == std::vector<float>{2, 2048});
  Tensor b = from_vector(std::vector<float>{3}, {1}, {.dtype = DType::bf16});
  CHECK((b / 3).to_vector<float>() == std::vector<float>{1});
}

TEST_CASE("sum over all, axes, keepdim") {
  Tensor a = arange(24, {.dtype = DType::f32}).view({2, 3, 4});
  Tensor s = sum(a);
  CHECK(s.dim() == 0);
  CHECK(s.item<float>() == 276);
  CHECK(sum(a, {0}).shape() == Shape{3, 4});
  CHECK(sum(a, {0}).to_vector<float>()[0] == 12);
  CHECK(sum(a, {-1}, true).shape() == Shape{2, 3, 1});
  CHECK(sum(a, {-1}, true).to_vector<float>() == std::vector<float>{6, 22, 38, 54, 70, 86});
  CHECK(sum(a, {0, 2}).to_vector<float>() == std::vector<float>{60, 92, 124});
  CHECK(sum(a, {}).shape() == a.shape());
  CHECK(sum(scalar_tensor(2.5)).item<float>() == 2.5f);
  CHECK(sum(zeros({0, 3}), {0}).to_vector<float>() == std::vector<float>{0, 0, 0});
  // Non-contiguous input.
  Tensor t = broadcast_to(f32({1, 2, 3}, {3, 1}), {3, 5});
  CHECK(sum(t, {1}).to_vector<float>() == std::vector<float>{5, 10, 15});
  // Integers and bools sum in i64.
  CHECK(sum(ones({3}, {.dtype = DType::boolean})).dtype() == DType::i64);
  CHECK(sum(full({3}, 2000000000, {.dtype = DType::i32})).item<std::int64_t>() == 6000000000LL);
}

TEST_CASE("sums are pairwise: a million f32 ones and f16 values stay exact") {
  CHECK(sum(ones({1 << 24})).item<float>() == 16777216.0f);
  CHECK(sum(full({1 << 20}, 0.1, {.dtype = DType::f32})).item<double>() == doctest::Approx(104857.6).epsilon(1e-6));
  CHECK(sum(ones({4096}, {.dtype = DType::f16})).item<float>() == 4096);  // f32 accumulation
}

TEST_CASE("errors name the op and the offending shapes or dtypes") {
  Tensor a = zeros({2, 3}), b = zeros({4});
  CHECK(message_of<ShapeError>([&] { add(a, b); }) == "[add] shapes (2,3) and (4,) cannot be broadcast together");
  CHECK(message_of<ShapeError>([&] { mul(a, b); }).starts_with("[mul] shapes (2,3) and (4,)"));
  Tensor bools = ones({2}, {.dtype = DType::boolean});
  CHECK(message_of<DTypeError>([&] { sub(bools, bools); }).starts_with("[sub] dtype bool is not supported (supported: f32"));
  CHECK(message_of<ShapeError>([&] { sum(a, {2}); }) == "[sum] axis 2 is out of range for shape (2,3)");
  CHECK(message_of<ShapeError>([&] { sum(a, {0, -2}); }) == "[sum] axis 0 appears twice");
  CHECK(message_of<ShapeError>([&] { a.view({4, 2}); }) == "[view] shape (4,2) is invalid for a tensor of 6 elements");
  CHECK(message_of<ShapeError>([&] { broadcast_to(a, {3, 3}); }).starts_with("[broadcast_to]"));
  CHECK(message_of<DTypeError>([&] { ones({2}, {.dtype = DType::i64}).requires_grad_(); }).starts_with("[requires_grad]"));
  CHECK(message_of<ValueError>([&] { arange(0, 1, 0); }).starts_with("[arange]"));
  CHECK(message_of<ValueError>([&] { randint(3, 3, {2}); }).starts_with("[randint]"));
  CHECK(message_of<ShapeError>([&] { a.item<float>(); }).starts_with("[item]"));
  CHECK(message_of<ShapeError>([&] { from_vector(std::vector<float>{1}, {2}); }).starts_with("[from_vector]"));
  CHECK(message_of<DTypeError>([&] { ones({2}, {.dtype = DType::i32}).add_(0.5); }).starts_with("[add_] the result's dtype f32 cannot be written in place"));
}

TEST_CASE("a fill value or randint range that does not fit the dtype is refused, naming the op") {
  auto msg = [](auto f) { return kiln_test::message_of<ValueError>(f); };
  CHECK(msg([] { full({2}, -1.5, {.dtype = DType::u8}); }).find("[full] the value -1.5 does not fit dtype u8") == 0);
  CHECK(msg([] { full({2}, std::nan(""), {.dtype = DType::i32}); }).find("[full]") == 0);
  CHECK(msg([] { pad(zeros({2}, {.dtype = DType::u8}), {1, 1}, 300); }).find("[pad]") == 0);
  CHECK(msg([] { zeros({2}, {.dtype = DType::f16}).fill_(1e6); }).find("[fill_]") == 0);
  CHECK(msg([] { randint(-5, 9, {3}, {.dtype = DType::u8}); }).find("[randint]") == 0);
  CHECK(msg([] { randint(0, 257, {3}, {.dtype = DType::u8}); }).find("[randint]") == 0);
  // What fits: a fraction dropped, infinities in floating dtypes, any number as a bool.
  CHECK(full({1}, 1.5, {.dtype = DType::i32}).item<std::int32_t>() == 1);
  CHECK(std::isinf(full({1}, -INFINITY, {.dtype = DType::f16}).item<float>()));
  CHECK(full({1}, 255, {.dtype = DType::u8}).item<std::uint8_t>() == 255);
  CHECK(full({1}, 7, {.dtype = DType::boolean}).item<bool>());
  CHECK(randint(0, 256, {100}, {.dtype = DType::u8}).numel() == 100);
}
