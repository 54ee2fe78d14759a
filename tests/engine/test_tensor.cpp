// Tensors: devices, creation, views, strides, contiguity, host conversions.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "error_message.h"
#include "kiln/kiln.h"
#include "kiln/runtime/device.h"

using namespace kiln;

TEST_CASE("device parses and prints") {
  CHECK(Device::parse("cpu") == Device::cpu());
  CHECK(Device::parse("cuda") == Device::cuda(0));
  CHECK(Device::parse("cuda:3").index() == 3);
  CHECK(Device::cuda(1).str() == "cuda:1");
  CHECK(Device::cpu() != Device::cuda(0));
  CHECK_THROWS_AS(Device::parse("cuda:"), DeviceError);
  CHECK_THROWS_AS(Device::parse("gpu"), DeviceError);
  CHECK_THROWS_AS(Device::parse("cuda:-1"), DeviceError);
  CHECK_THROWS_AS(Device::cuda(-2), DeviceError);
}

TEST_CASE("half and bfloat16 conversions round to nearest even") {
  CHECK(float_to_half_bits(1.0f) == 0x3c00);
  CHECK(float_to_half_bits(65504.0f) == 0x7bff);
  CHECK(float_to_half_bits(65520.0f) == 0x7c00);  // halfway to the next power: rounds to inf
  CHECK(float_to_half_bits(-2.0f) == 0xc000);
  CHECK(float_to_half_bits(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  CHECK(float_to_half_bits(std::ldexp(1.0f, -25)) == 0x0000);  // a tie rounds to even (zero)
  CHECK(float_to_half_bits(std::ldexp(3.0f, -26)) == 0x0001);  // 0.75 ulp rounds up
  CHECK(float_to_half_bits(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);  // tie to even
  CHECK(float_to_half_bits(1.0f + std::ldexp(3.0f, -11)) == 0x3c02);  // tie to even (up)
  CHECK(std::isnan(half_bits_to_float(float_to_half_bits(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(half_bits_to_float(0x0001) == std::ldexp(1.0f, -24));
  CHECK(half_bits_to_float(0x3555) == doctest::Approx(0.33325195f));
  for (std::uint32_t h = 0; h < 0x7c00; h += 7) CHECK(float_to_half_bits(half_bits_to_float(h)) == h);
  CHECK(float_to_bf16_bits(1.0f) == 0x3f80);
  CHECK(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);  // tie to even
  CHECK(float_to_bf16_bits(1.0f + std::ldexp(3.0f, -8)) == 0x3f82);
  CHECK(bf16_bits_to_float(0x4049) == 3.140625f);
}

TEST_CASE("from_vector, shape, strides and item") {
  Tensor t = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(t.dtype() == DType::f32);
  CHECK(t.shape() == Shape{2, 3});
  CHECK(t.strides() == Shape{3, 1});
  CHECK(t.dim() == 2);
  CHECK(t.numel() == 6);
  CHECK(t.size(-1) == 3);
  CHECK_THROWS_AS(t.size(2), ShapeError);
  CHECK_THROWS_AS(scalar_tensor(1).size(0), ShapeError);
  CHECK(t.device() == Device::cpu());
  CHECK(t.is_contiguous());
  CHECK(t.to_vector<double>() == std::vector<double>{1, 2, 3, 4, 5, 6});
  CHECK_THROWS_AS(t.item<float>(), ShapeError);
  CHECK(scalar_tensor(2.5).item<float>() == 2.5f);
  CHECK(scalar_tensor(7).dtype() == DType::i64);
  CHECK_THROWS_AS(from_vector(std::vector<float>{1, 2, 3}, {2, 2}), ShapeError);
  Tensor h = from_vector(std::vector<double>{0.1, 1e5}, {2}, {.dtype = DType::f16});
  CHECK(h.dtype() == DType::f16);
  CHECK(h.to_vector<float>()[0] == half_bits_to_float(float_to_half_bits(0.1f)));
  CHECK(std::isinf(h.to_vector<float>()[1]));
  Tensor b = from_vector(std::vector<bool>{true, false, true});
  CHECK(b.dtype() == DType::boolean);
  CHECK(b.to_vector<std::int32_t>() == std::vector<std::int32_t>{1, 0, 1});
}

TEST_CASE("creation functions") {
  CHECK(zeros({2, 2}).to_vector<float>() == std::vector<float>(4, 0.0f));
  CHECK(ones({3}, {.dtype = DType::i32}).to_vector<std::int32_t>() == std::vector<std::int32_t>{1, 1, 1});
  CHECK(full({2}, 1.5, {.dtype = DType::bf16}).to_vector<float>() == std::vector<float>{1.5f, 1.5f});
  CHECK(full({2}, 3).dtype() == DType::i64);
  CHECK(full({2}, true).dtype() == DType::boolean);
  CHECK(empty({0, 3}).numel() == 0);
  Tensor a = arange(5);
  CHECK(a.dtype() == DType::i64);
  CHECK(a.to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1, 2, 3, 4});
  CHECK(arange(1, 2, 0.25).to_vector<float>() == std::vector<float>{1.0f, 1.25f, 1.5f, 1.75f});
  CHECK(arange(10, 0, -3).to_vector<std::int64_t>() == std::vector<std::int64_t>{10, 7, 4, 1});
  CHECK_THROWS_AS(arange(0, 5, 0), ValueError);
  CHECK_THROWS_AS(arange(0, 5, -1), ValueError);
  std::vector<double> l = linspace(0, 1, 5, {.dtype = DType::f64}).to_vector<double>();
  CHECK(l == std::vector<double>{0, 0.25, 0.5, 0.75, 1});
  CHECK(linspace(-1, 1, 1).to_vector<float>() == std::vector<float>{-1});
  CHECK(eye(2, 3).to_vector<float>() == std::vector<float>{1, 0, 0, 0, 1, 0});
  CHECK(eye(3, {.dtype = DType::i64}).to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 0, 0, 0, 1, 0, 0, 0, 1});
  Tensor z = zeros_like(eye(2, {.dtype = DType::f64}));
  CHECK(z.dtype() == DType::f64);
  CHECK(z.shape() == Shape{2, 2});
  CHECK(ones({2}, {.requires_grad = true}).requires_grad());
}

TEST_CASE("views share storage and the version counter") {
  Tensor t = arange(12, {.dtype = DType::f32});
  Tensor v = t.view({3, 4});
  CHECK(v.shares_storage(t));
  CHECK(v.strides() == Shape{4, 1});
  CHECK(t.view({-1, 6}).shape() == Shape{2, 6});
  CHECK_THROWS_AS(t.view({5, -1}), ShapeError);
  CHECK_THROWS_AS(t.view({-1, -1}), ShapeError);
  v.add_(1);
  CHECK(t.to_vector<float>()[0] == 1.0f);
  CHECK(t.version() == 1);
  CHECK(v.version() == 1);

  // A transposed view (built from strides) is not contiguous; contiguous() copies it.
  Tensor tr = broadcast_to(from_vector(std::vector<float>{1, 2, 3}, {3, 1}), {3, 2});
  CHECK(tr.strides() == Shape{1, 0});
  CHECK_FALSE(tr.is_contiguous());
  Tensor c = tr.contiguous();
  CHECK(c.is_contiguous());
  CHECK_FALSE(c.shares_storage(tr));
  CHECK(c.to_vector<float>() == std::vector<float>{1, 1, 2, 2, 3, 3});
  Tensor cc = c.contiguous();
  CHECK(cc.is_same(c));

  // reshape copies when no view exists; view refuses.
  CHECK_THROWS_AS(tr.view({6}), ShapeError);
  Tensor r = tr.reshape({6});
  CHECK_FALSE(r.shares_storage(tr));
  CHECK(r.to_vector<float>() == std::vector<float>{1, 1, 2, 2, 3, 3});
  CHECK(c.reshape({2, 3}).shares_storage(c));
}

TEST_CASE("to(dtype) converts with the kernels' conventions") {
  Tensor f = from_vector(std::vector<float>{-1.7f, 2.9f, 300.5f, NAN, 1e20f});
  CHECK(f.to(DType::f32).is_same(f));
  CHECK(f.to(DType::i32).to_vector<std::int32_t>() ==
        std::vector<std::int32_t>{-1, 2, 300, 0, std::numeric_limits<std::int32_t>::max()});
  CHECK(f.to(DType::u8).to_vector<std::int32_t>() == std::vector<std::int32_t>{255, 2, 44, 0, 255});
  CHECK(f.to(DType::boolean).to_vector<bool>() == std::vector<bool>{true, true, true, true, true});
  Tensor i = from_vector(std::vector<std::int64_t>{3, -4});
  CHECK(i.to(DType::f64).to_vector<double>() == std::vector<double>{3, -4});
  CHECK(i.to(DType::bf16).to_vector<float>() == std::vector<float>{3, -4});
}

TEST_CASE("in-place ops and copy_") {
  Tensor t = zeros({2, 3});
  t.fill_(2.5);
  CHECK(t.to_vector<float>() == std::vector<float>(6, 2.5f));
  t.mul_(from_vector(std::vector<float>{1, 2, 3}));
  CHECK(t.to_vector<float>() == std::vector<float>{2.5, 5, 7.5, 2.5, 5, 7.5});
  t.sub_(0.5).div_(2);
  CHECK(t.to_vector<float>() == std::vector<float>{1, 2.25, 3.5, 1, 2.25, 3.5});
  t.zero_();
  CHECK(t.to_vector<float>() == std::vector<float>(6, 0.0f));
  t.copy_(from_vector(std::vector<std::int32_t>{4, 5, 6}));
  CHECK(t.to_vector<float>() == std::vector<float>{4, 5, 6, 4, 5, 6});
  CHECK(t.version() == 6);

  Tensor i = ones({3}, {.dtype = DType::i32});
  CHECK_THROWS_AS(i.add_(0.5), DTypeError);                 // f32 result cannot go into i32
  CHECK_THROWS_AS(i.add_(ones({2, 3}, {.dtype = DType::i32})), ShapeError);  // would broadcast the target
  Tensor h = ones({2}, {.dtype = DType::f16});
  h.add_(ones({2}));  // f32 result cast back into f16
  CHECK(h.dtype() == DType::f16);
  CHECK(h.to_vector<float>() == std::vector<float>{2, 2});

  Tensor m = arange(4, {.dtype = DType::f32}).view({2, 2});
  m.add_(m);  // same storage, same layout: elementwise in place is safe
  CHECK(m.to_vector<float>() == std::vector<float>{0, 2, 4, 6});
}

TEST_CASE("ops on a GPU tensor without a GPU say why") {
  if (rt::gpu_available()) return;
  CHECK_THROWS_AS(zeros({2}, {.device = Device::cuda(0)}), DeviceError);
  CHECK_THROWS_AS(ones({2}).to(Device::cuda(0)), DeviceError);
}

TEST_CASE("shapes whose strides, element or byte counts pass int64 are ShapeErrors at creation") {
  constexpr std::int64_t kBig = (std::int64_t{1} << 62) - 1;
  // A zero dim made the numel 0, but the strides of (0, 2^62-1, 2^62-1) still overflowed.
  CHECK(kiln_test::message_of<ShapeError>([] { empty({0, kBig, kBig}); }).find("[tensor]") == 0);
  CHECK_THROWS_AS(empty({kBig, kBig, 0}), ShapeError);
  CHECK_THROWS_AS(empty({std::int64_t{1} << 32, std::int64_t{1} << 32}), ShapeError);
  CHECK_THROWS_AS(empty({std::int64_t{1} << 61}, {.dtype = DType::f64}), ShapeError);  // 2^64 bytes
  CHECK_THROWS_AS(empty({-1}), ShapeError);
  CHECK_THROWS_AS(empty({2, -3}), ShapeError);
  CHECK_THROWS_AS(zeros({0, kBig, kBig}), ShapeError);
  CHECK_THROWS_AS(zeros({0}).reshape({0, kBig, kBig}), ShapeError);
  CHECK_THROWS_AS(contiguous_strides({0, kBig, kBig}), ShapeError);
  // At the limit itself, strides still fit.
  CHECK(contiguous_strides({0, kBig, 2}) == Shape{2 * kBig, 2, 1});
  CHECK(empty({0, kBig}, {.dtype = DType::u8}).numel() == 0);
  CHECK_THROWS_AS(empty({0, kBig}, {.dtype = DType::f32}), ShapeError);  // its byte strides would not fit
}
