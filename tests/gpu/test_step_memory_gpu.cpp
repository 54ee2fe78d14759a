// A compiled step's memory: its values are laid out by lifetime in the graph's private pool, so
// a block freed in the step serves a later value of another size, and the step reports the
// bytes its values held at once beside the bytes its graph holds.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "gpu_match.h"
#include "kiln/kiln.h"

using namespace kiln;
using kiln_test::kGpu;

namespace {

constexpr std::int64_t kFloats = std::int64_t{1} << 20;  // 4 MiB of f32
constexpr std::size_t kMiB = std::size_t{1} << 20;

// Eight rounds, each of two values a tenth smaller than the last round's: no two sizes alike.
std::vector<Tensor> shrinking_rounds(const std::vector<Tensor>& in) {
  Tensor total = zeros({1}, {.device = kGpu});
  for (int i = 0; i < 8; ++i) {
    const Tensor part = narrow(in[0], 0, 0, kFloats - i * (kFloats / 10));
    const Tensor doubled = mul(part, 2.0);  // (n,) f32, ends with the round
    const Tensor shifted = add(doubled, 1.0);
    total = add(total, sum(shifted));
  }
  return {total};
}

}  // namespace

TEST_CASE("compiled step memory: a freed value's block serves later values of other sizes") {
  const Tensor x = div(arange(kFloats, {.dtype = DType::f32, .device = kGpu}), static_cast<double>(kFloats));
  CompileOptions unfused;
  unfused.fuse = false;  // every value of the rounds is written
  CompiledFunction step = compile(shrinking_rounds, unfused);
  const Tensor eager = shrinking_rounds({x})[0];
  for (int call = 0; call < 3; ++call) CHECK(f32_bits(step({x})[0]) == f32_bits(eager));  // eager, capture, replay
  const CompileStats s = step.stats();
  REQUIRE(s.graphs == 1);
  // Live at once: the static input and one round's two values, 12 MiB; every value of its own
  // block would be 4 + 2 * (4 + 3.6 + ... + 1.2) = 47.2 MiB.
  CHECK(s.bytes_live_peak >= 12 * kMiB);
  CHECK(s.bytes_live_peak < 13 * kMiB);
  CHECK(s.bytes_held >= s.bytes_live_peak);
  // The input's chunk, one for each of the first round's values, and a page for the sums: the
  // later rounds' values fit in the first round's blocks.
  CHECK(s.bytes_held <= 14 * kMiB);
}
