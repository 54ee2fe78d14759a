// A compiled step's casts of its inputs (autocast's of the images) and its gathers of rows by
// them (a batch of a dataset on the device) are done by the graph's input copy: the bits of the
// cast and gather kernels, no kernel of their own, and a step that writes its input before
// casting it, casts it twice, or writes the source it gathers from still gets what eager gets.
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

namespace {

// One index_select of `source` by `index` inside a compiled function and eagerly, as bytes.
std::vector<unsigned char> bytes_of(const Tensor& t) {
  const Tensor h = t.to(Device::cpu()).contiguous();
  std::vector<unsigned char> b(static_cast<std::size_t>(h.numel()) * h.element_size());
  std::memcpy(b.data(), h.data_ptr(), b.size());
  return b;
}

}  // namespace

TEST_CASE(
    "compile: the input copy gathers a step's rows by its input with index_select's bytes, and no gather kernel runs") {
  Generator g(12);
  // Rows of 1568 bytes (16-byte words), 8 (i64 labels), 12 (4-byte words) and 3 (bytes).
  const std::vector<Tensor> sources{randn({300, 1, 28, 28}, {}, &g).to(DType::bf16).to(kGpu),
                                    randint(0, 10, {300}, {}, &g).to(kGpu), randn({300, 3}, {}, &g).to(kGpu),
                                    randint(0, 255, {300, 3}, {}, &g).to(DType::u8).to(kGpu)};
  CompiledFunction cf = compile([&](const std::vector<Tensor>& in) {
    std::vector<Tensor> out;
    for (const Tensor& s : sources) out.push_back(index_select(s, 0, in[0]));
    return out;
  });
  for (int call = 0; call < 4; ++call) {  // eager, capture, two replays
    CAPTURE(call);
    std::vector<std::int64_t> rows;
    for (int i = 0; i < 64; ++i) rows.push_back((i * 37 + call * 11) % 300);
    rows[3] = -1, rows[9] = 300, rows[17] = 100000;  // out of range: rows of zeros, as index_select writes
    const Tensor index = from_data(rows.data(), {64}, DType::i64, kGpu);
    const std::vector<Tensor> got = cf({index});
    for (std::size_t k = 0; k < sources.size(); ++k) {
      CAPTURE(k);
      CHECK(bytes_of(got[k]) == bytes_of(index_select(sources[k], 0, index)));
    }
  }
  const CompileStats stats = cf.stats();
  REQUIRE(stats.kernels_per_graph.size() == 1);
  CHECK(stats.kernels_per_graph[0] == 1);
  CHECK(stats.kernel_names_per_graph[0].count("kiln_copy_inputs") == 1);
}

TEST_CASE(
    "compile: a step that writes the source it gathers from, or gathers from one needing gradients, gathers itself") {
  Generator g(13);
  const Tensor start = randn({40, 5}, {}, &g).to(kGpu);
  std::vector<std::int64_t> rows{3, 1, 39, 0, 7};
  const Tensor index = from_data(rows.data(), {5}, DType::i64, kGpu);
  Tensor written = start.clone(), eager_written = start.clone();
  auto step = [](Tensor& source) {
    return [&source](const std::vector<Tensor>& in) {
      Tensor r = index_select(source, 0, in[0]);
      source.add_(1.0);
      return std::vector<Tensor>{r};
    };
  };
  CompiledFunction cf = compile(step(written));
  auto eager = step(eager_written);
  for (int call = 0; call < 4; ++call) {
    CAPTURE(call);
    CHECK(kiln_test::f32_bits(cf({index})[0]) == kiln_test::f32_bits(eager({index})[0]));
  }
  CHECK(kiln_test::f32_bits(written) == kiln_test::f32_bits(eager_written));
  CHECK(cf.stats().kernel_names_per_graph.at(0).count("kiln_gather") == 1);

  // A source that requires grad: autograd records index_select's node, so the step gathers itself.
  const Tensor weights = start.clone().requires_grad_();
  CompiledFunction grad =
      compile([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{index_select(weights, 0, in[0])}; });
  for (int call = 0; call < 3; ++call)
    CHECK(kiln_test::f32_bits(grad({index})[0]) == kiln_test::f32_bits(index_select(start, 0, index)));
  CHECK(grad.stats().kernel_names_per_graph.at(0).count("kiln_gather") == 1);
}
