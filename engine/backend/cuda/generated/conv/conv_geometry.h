#pragma once
// What every generated convolution kernel is planned from: the pass, the convolution's sizes
// (ConvGeometry, listed once: its key words and its text), the arithmetic (ConvMath), the
// device's limits (ConvTarget) and the operands as device pointers (ConvOperands).
#include <cstdint>
#include <optional>
#include <string>

#include "kiln/dtype.h"
#include "kiln/runtime/generated_kernels.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/memory.h"

namespace kiln::kernels {

// forward: (a, b) = (x, w) -> out = y; grad_input: (gy, w) -> dx; grad_weight: (x, gy) -> dw.
enum class ConvPass { forward = 0, grad_input = 1, grad_weight = 2 };
const char* pass_name(ConvPass p);  // "fwd", "dgrad", "wgrad"

// Sizes of one convolution over NCHW input and OIHW weight.
struct ConvGeometry {
  std::int64_t n, c, h, w, o, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, groups;
  std::int64_t cg() const { return c / groups; }  // input channels per group
  std::int64_t og() const { return o / groups; }  // output channels per group
  // Every size, as words of a generated module's key.
  void add_to(rt::GeneratedKey& key) const;
  // "n c h w o kh kw oh ow sh sw ph pw dh dw groups": the tuner's problem text.
  std::string text() const;
};

// The arithmetic of a generated kernel: a tensor-core MMA type, or exact f32 on the CUDA cores.
enum class ConvMath { bf16 = 0, f16 = 1, tf32 = 2, f32 = 3 };
const char* math_name(ConvMath m);
// The arithmetic for these dtypes, or none (f64, mixed dtypes). f32 takes TF32 when `tf32`.
std::optional<ConvMath> conv_math(DType a, DType b, DType out, bool tf32);
inline bool tensor_cores(ConvMath m) { return m != ConvMath::f32; }

// The limits a plan is made for.
struct ConvTarget {
  int sm_count = 132;
  int max_shared = 227 * 1024;  // bytes per block after opting in
};

// Contiguous operands in the pass's order (see ConvPass) on one device, of one dtype; with
// `f32_out`, a weight gradient of f16/bf16 operands written in f32 (autocast's parameters).
// `totals` (a forward's, or 0): the output's per-channel sums and squares of its values as
// stored, (2, o) in f64, for a batch norm that reads it; `stats`, their partials' scratch.
struct ConvOperands {
  rt::DevicePtr a = 0, b = 0, out = 0;
  DType dtype = DType::f32;
  const rt::Stream* stream = nullptr;
  bool f32_out = false;
  // A forward's statistics for the batch norm that reads its output: the tile engine's f64
  // totals (2, channels) with its partials in `stats`; the patch and direct kinds park f32
  // partials (2 * channels, blocks) in `stats`. run_generated_conv sets *stats_rows to the
  // blocks of the kind that ran (0: totals).
  rt::DevicePtr totals = 0, stats = 0;
  std::int64_t* stats_rows = nullptr;
  // An input gradient's: the pooled batch norm whose sums it also parks (ConvPoolSums), or null.
  const struct ConvPoolSums* pool_sums = nullptr;
};

// The backward of a batch norm with 2 x 2 max-pool windows, in training, whose whole pooled
// gradient an input gradient is: what its reduction reads besides the gradient (x (n, c, h, w)
// in the conv's dtype, the parameters in `p` (0 where absent), the saved mean and invstd in f32),
// and where the conv's blocks park its sums: `parts` (2 * c, splits), *splits set by
// run_generated_conv to those of the kind that ran.
struct ConvPoolSums {
  rt::DevicePtr x = 0, weight = 0, bias = 0, mean = 0, invstd = 0, parts = 0;
  DType p = DType::f32;
  std::int64_t h = 0, w = 0;
  bool relu = false;
  std::int64_t* splits = nullptr;
};

}  // namespace kiln::kernels
