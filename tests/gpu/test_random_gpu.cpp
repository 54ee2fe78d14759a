// Philox on the GPU: the same seed and call sequence give bit-identical numbers on the
// CPU and the GPU, for every distribution and dtype.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "gpu_match.h"

using namespace kiln;

namespace {

using kiln_test::kGpu;

// Raw bytes of a tensor, copied to the host.
std::vector<std::uint8_t> bytes_of(const Tensor& t) {
  Tensor h = t.to(Device::cpu()).contiguous();
  std::vector<std::uint8_t> b(static_cast<std::size_t>(h.numel()) * h.element_size());
  if (!b.empty()) std::memcpy(b.data(), h.data_ptr(), b.size());
  return b;
}

// The first element where the two tensors' bits differ, or -1.
std::int64_t first_mismatch(const Tensor& cpu, const Tensor& gpu) {
  auto a = bytes_of(cpu), b = bytes_of(gpu);
  if (a.size() != b.size()) return 0;
  const std::size_t es = cpu.element_size();
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<std::int64_t>(i / es);
  return -1;
}

void check_identical(const Tensor& cpu, const Tensor& gpu, const std::string& name) {
  CAPTURE(name);
  REQUIRE(gpu.device() == kGpu);
  REQUIRE(cpu.shape() == gpu.shape());
  std::int64_t i = first_mismatch(cpu, gpu);
  if (i >= 0) {
    FAIL_CHECK(name << ": first mismatch at element " << i << ": cpu " << cpu.to_vector<double>()[i] << ", gpu "
                    << gpu.to(Device::cpu()).to_vector<double>()[i]);
  }
}

}  // namespace

TEST_CASE("rand and randn: same seed, same bits on CPU and GPU") {
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    for (const Shape& shape : {Shape{}, Shape{1}, Shape{5, 7, 11, 13}, Shape{1 << 20}, Shape{3, 3}}) {
      Generator gc(0x5eed5eed12345678ULL), gg(0x5eed5eed12345678ULL);
      gc.set_offset(1000);
      gg.set_offset(1000);
      const std::string tag = std::string(dtype_name(dt)) + ", shape=" + shape_str(shape);
      // Two calls each: the second starts where the first left the offset.
      check_identical(rand(shape, {.dtype = dt}, &gc), rand(shape, {.dtype = dt, .device = kGpu}, &gg), "rand(" + tag + ")");
      check_identical(randn(shape, {.dtype = dt}, &gc), randn(shape, {.dtype = dt, .device = kGpu}, &gg),
                      "randn(" + tag + ")");
      CHECK(gc.offset() == gg.offset());
    }
  }
}

TEST_CASE("randint and bernoulli: same seed, same bits on CPU and GPU") {
  for (DType dt : {DType::i64, DType::i32, DType::u8, DType::f32, DType::f16}) {
    Generator gc(77), gg(77);
    const std::int64_t low = dt == DType::u8 ? 3 : -50, high = dt == DType::u8 ? 250 : 1000;
    check_identical(randint(low, high, {4099}, {.dtype = dt}, &gc),
                    randint(low, high, {4099}, {.dtype = dt, .device = kGpu}, &gg),
                    "randint(dtype=" + std::string(dtype_name(dt)) + ")");
  }
  Generator gc(78), gg(78);
  check_identical(randint(-(std::int64_t{1} << 40), std::int64_t{1} << 41, {1001}, {}, &gc),
                  randint(-(std::int64_t{1} << 40), std::int64_t{1} << 41, {1001}, {.device = kGpu}, &gg),
                  "randint(wide range)");
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    check_identical(bernoulli({3001}, 0.3, {.dtype = dt}, &gc), bernoulli({3001}, 0.3, {.dtype = dt, .device = kGpu}, &gg),
                    "bernoulli(dtype=" + std::string(dtype_name(dt)) + ")");
    Tensor p = rand({513}, {.dtype = dt}, &gc);
    rand({513}, {.dtype = dt}, &gg);  // keep the two generators in step
    check_identical(bernoulli(p, &gc), bernoulli(p.to(kGpu), &gg),
                    "bernoulli_tensor(dtype=" + std::string(dtype_name(dt)) + ")");
  }
}

TEST_CASE("the default generator gives the same sequence on both devices") {
  manual_seed(2024);
  Tensor a = randn({1000});
  Tensor b = rand({10});
  manual_seed(2024);
  Tensor ga = randn({1000}, {.device = kGpu});
  Tensor gb = rand({10}, {.device = kGpu});
  check_identical(a, ga, "randn after manual_seed");
  check_identical(b, gb, "rand after manual_seed");
}
