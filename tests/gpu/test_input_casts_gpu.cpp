// A compiled step's casts of its inputs (autocast's of the images) are written by the graph's
// input copy: the cast kernel's bits, no kernel of their own, and a step that writes its input
// before casting it, or casts it twice, still gets what its eager calls get.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "gpu_match.h"
#include "kiln/half.h"
#include "kiln/kiln.h"

using namespace kiln;
using kiln_test::half_bits;
using kiln_test::kGpu;

namespace {

// n f32 values from random bit patterns (every exponent, NaNs and subnormals among them), the
// first ones rounding's hard cases.
std::vector<float> hard_values(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<float> v(n);
  for (float& x : v) {
    const std::uint32_t bits = gen();
    std::memcpy(&x, &bits, sizeof x);
  }
  const float special[] = {0.0f,
                           -0.0f,
                           1.0f + 0x1p-8f,
                           1.0f + 0x3p-8f,
                           1.0f + 0x1p-11f,
                           1.0f + 0x3p-11f,
                           65520.0f,
                           std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::denorm_min(),
                           0x1p-25f,
                           -0x1.8p-24f};
  for (std::size_t i = 0; i < std::min(n, std::size(special)); ++i) v[i] = special[i];
  return v;
}

std::uint16_t reference_bits(float x, DType to) {
  return to == DType::bf16 ? float_to_bf16_bits(x) : float_to_half_bits(x);
}

bool is_nan_bits(std::uint16_t b, DType to) {
  return to == DType::bf16 ? (b & 0x7fffu) > 0x7f80u : (b & 0x7fffu) > 0x7c00u;
}

}  // namespace

TEST_CASE(
    "compile: the input copy writes a step's cast of its input with the cast kernel's bits, and no cast kernel runs") {
  for (DType to : {DType::bf16, DType::f16})
    for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{4099}, std::size_t{128 * 784}}) {
      CAPTURE(dtype_name(to));
      CAPTURE(n);
      CompiledFunction cf =
          compile([to](const std::vector<Tensor>& in) { return std::vector<Tensor>{cast(in[0], to)}; });
      for (std::uint32_t call = 0; call < 4; ++call) {  // eager, capture, two replays
        CAPTURE(call);
        const std::vector<float> values = hard_values(n, 17 + call);
        const Tensor x = from_data(values.data(), {static_cast<std::int64_t>(n)}, DType::f32, kGpu);
        const std::vector<std::uint16_t> got = half_bits(cf({x})[0]);
        CHECK(got == half_bits(cast(x, to)));  // the cast kernel, outside any compiled call
        REQUIRE(got.size() == n);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const std::uint16_t want = reference_bits(values[i], to);
          // NaN's payload follows the instruction: the CPU keeps it, the GPU's cvt does not.
          wrong += is_nan_bits(want, to) ? !is_nan_bits(got[i], to) : got[i] != want;
        }
        CHECK(wrong == 0);
      }
      const CompileStats stats = cf.stats();
      REQUIRE(stats.kernels_per_graph.size() == 1);
      CHECK(stats.kernels_per_graph[0] == 1);
      CHECK(stats.kernel_names_per_graph[0].count("kiln_copy_inputs") == 1);
    }
}

TEST_CASE("compile: autocast training takes the images' cast from the input copy, bit for bit with eager") {
  auto train = [](bool compiled) {
    Generator gen(21);
    auto net = std::make_shared<nn::Sequential>(nn::Flatten(), nn::Linear(784, 10, true, &gen));
    net->to(kGpu);
    optim::Adam opt(net->parameters(), {.lr = 1e-2});
    auto step = [&](const std::vector<Tensor>& in) {
      AutocastGuard amp(DType::bf16);
      opt.zero_grad();
      Tensor loss = cross_entropy((*net)(in[0]), in[1]);
      loss.backward();
      opt.step();
      return std::vector<Tensor>{loss.detach()};
    };
    CompiledFunction cf = compile(step);
    Generator data(8);
    std::vector<std::uint32_t> losses;
    for (int i = 0; i < 5; ++i) {
      const Tensor x = randn({32, 1, 28, 28}, {}, &data).to(kGpu), y = randint(0, 10, {32}, {}, &data).to(kGpu);
      losses.push_back(kiln_test::f32_bits(compiled ? cf({x, y})[0] : step({x, y})[0])[0]);
    }
    std::vector<std::vector<std::uint32_t>> params;
    for (const Tensor& p : net->parameters()) params.push_back(kiln_test::f32_bits(p));
    return std::tuple{losses, params, cf.stats()};
  };
  const auto [eager_losses, eager_params, unused] = train(false);
  const auto [losses, params, stats] = train(true);
  CHECK(losses == eager_losses);
  CHECK(params == eager_params);
  REQUIRE(stats.kernel_names_per_graph.size() == 1);
  CHECK(stats.kernel_names_per_graph[0].count("kiln_unary") == 0);  // the images' cast
  CHECK(stats.kernel_names_per_graph[0].count("kiln_copy_inputs") == 1);
}

TEST_CASE("compile: a step that writes its input before the cast, or casts it twice, gets eager's values") {
  Generator g(5);
  const Tensor x = randn({1000}, {}, &g).to(kGpu);
  const std::vector<std::uint16_t> doubled = half_bits(cast(mul(x, 2.0), DType::bf16));
  const std::vector<std::uint16_t> once = half_bits(cast(x, DType::bf16));
  CompiledFunction written = compile([](const std::vector<Tensor>& in) {
    Tensor own = in[0];
    own.mul_(2.0);  // the copy's cast would be of the value before this write
    return std::vector<Tensor>{cast(own, DType::bf16)};
  });
  // Two casts of one input are two tensors: writing one leaves the other alone.
  CompiledFunction twice = compile([](const std::vector<Tensor>& in) {
    Tensor a = cast(in[0], DType::bf16), b = cast(in[0], DType::bf16);
    b.fill_(0.0);
    return std::vector<Tensor>{a, b};
  });
  for (int call = 0; call < 4; ++call) {
    CAPTURE(call);
    CHECK(half_bits(written({x.clone()})[0]) == doubled);
    const std::vector<Tensor> out = twice({x});
    CHECK(half_bits(out[0]) == once);
    CHECK(half_bits(out[1]) == std::vector<std::uint16_t>(1000, 0));
  }
  CHECK(written.stats().replays == 2);
  CHECK(twice.stats().replays == 2);
}
