#pragma once
// Counter-based random numbers (Philox 4x32-10), identical on CPU and GPU.
//
// Scheme, shared by engine/ops/random.cpp and kernel_templates/random.cu:
//   key = (seed low 32 bits, seed high 32 bits); a call of n values reserves
//   B = ceil(n / per_block) blocks at the generator's offset o and advances it by B.
//   Block b (0 <= b < B) is philox4x32_10({lo32(o + b), hi32(o + b), 0, 0}, key) = x[0..3],
//   and fills elements [b*per_block, (b+1)*per_block).
//   - uniform (4 per block) in [0, 1), exact in the dtype: f32 (x[j] >> 8) * 2^-24,
//     f16 (x[j] >> 21) * 2^-11, bf16 (x[j] >> 24) * 2^-8.
//   - uniform f64 (2 per block): (((x[2j] << 32) | x[2j+1]) >> 11) * 2^-53.
//   - normal (4 per block for f32/f16/bf16, 2 for f64): Box-Muller on the pairs (x[0], x[1])
//     and (x[2], x[3]) (f64: the two 64-bit words), u1 = (k1 + 1) * 2^-b in (0, 1] and
//     u2 = k2 * 2^-b with k the top b = 24 (53) bits: r = sqrt(-2 log u1), z0 = r cos(2 pi u2),
//     z1 = r sin(2 pi u2). Computed in f64 with kiln's own log and sincos (polynomials with
//     explicit roundings: no libm, no FMA contraction), so both devices produce the same
//     bits; then rounded to the dtype (f16/bf16 through f32).
//   - randint in [low, high) (4 per block when high - low <= 2^32, else 2 per block using
//     the 64-bit words above): low + word % (high - low).
//   - bernoulli (4 per block): 1 where (x[j] >> 8) * 2^-24 < p (p_i for a tensor of
//     probabilities), else 0.
#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>

#include "tensor.h"

namespace kiln {

std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> counter, std::array<std::uint32_t, 2> key);

class Generator {
 public:
  explicit Generator(std::uint64_t seed = 0x2545f4914f6cdd1dULL) : seed_(seed) {}
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  void manual_seed(std::uint64_t seed);  // also rewinds the offset to 0
  std::uint64_t seed() const;
  std::uint64_t offset() const;  // in Philox blocks
  void set_offset(std::uint64_t blocks);
  // Reserves `blocks` consecutive Philox blocks and returns the first block's counter.
  std::uint64_t reserve(std::uint64_t blocks);

 private:
  mutable std::mutex mu_;
  std::uint64_t seed_;
  std::uint64_t offset_ = 0;
};

Generator& default_generator();
void manual_seed(std::uint64_t seed);  // the default generator's

// nullptr: the default generator. Floating dtypes default to f32, randint to i64.
Tensor rand(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);
Tensor randn(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);
Tensor randint(std::int64_t low, std::int64_t high, const Shape& shape, TensorOptions options = {},
               Generator* gen = nullptr);
// 1 with probability p, else 0, in options.dtype (f32 by default).
Tensor bernoulli(const Shape& shape, double p, TensorOptions options = {}, Generator* gen = nullptr);
// Elementwise: 1 with probability p[i]; same dtype, shape and device as p.
Tensor bernoulli(const Tensor& p, Generator* gen = nullptr);

}  // namespace kiln
