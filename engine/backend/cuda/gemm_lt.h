#pragma once
// One GEMM through cuBLASLt, for the products whose epilogue fuses work that would otherwise be
// kernels of its own: a bias (and ReLU) added to the output, or the bias gradient taken as a
// sum over the product's k dimension. Column-major, as cuBLASLt sees it:
//   D (m x n) = op(A) (m x k) @ op(B) (k x n)           [+ bias (m), then ReLU]
//   bias_grad (n) = sum over k of op(B)                    (bgrad_b)
//   D zeroed where mask (m x n, D's layout) is not > 0     (relu_mask: a ReLU's mask on a gradient)
// The algorithm is chosen per (device, dtype, sizes, layouts, epilogue, alignment): cuBLASLt's
// first 16 candidates timed once (tuner.h), and the choice kept in the disk cache.
#include <cstdint>
#include <optional>

#include "backend/cuda/generated/gemm/gemm_plan.h"
#include "kiln/dtype.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/memory.h"
#include "kiln/runtime/tuning.h"

namespace kiln::kernels {

// relu_mask is kiln's: cuBLASLt's algorithms store D and one elementwise pass masks it, the
// generated kernels mask each sum as they store it.
enum class LtEpilogue { none, bias, relu_bias, bgrad_b, relu_mask };

struct LtMatmul {
  DType dtype = DType::f32;  // A, B, D and the bias; f16/bf16 accumulate in f32
  // D and the bias in another dtype: f32 for f16/bf16 inputs (a weight gradient written in
  // f32 under autocast). Unset: dtype.
  std::optional<DType> out{};
  std::int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  std::int64_t lda = 0, ldb = 0, ldd = 0;
  LtEpilogue epilogue = LtEpilogue::none;
  rt::DevicePtr a = 0, b = 0, d = 0;
  // Read (bias, relu_bias: m values; relu_mask: the mask, m x n in D's dtype and layout) or written
  // (bgrad_b: n values).
  rt::DevicePtr bias = 0;
};

// Enqueues the product on `s`. false, enqueuing nothing, when cuBLASLt has no algorithm for
// it (the caller then takes another path); DTypeError for a dtype it never handles.
[[nodiscard]] bool lt_matmul(const LtMatmul& g, const rt::Stream& s);

// Whether measuring the product's choice (KILN_TUNE=auto) times a generated kernel beside
// cuBLASLt's algorithms on the device, one that must compile first: a shallow product's FFMA
// kernel (on sm_90 any small exact-f32 product's), or a large exact-f32 product's three-TF32
// tile kernel on sm_90.
bool lt_measures_generated(const LtMatmul& g, int device);

// Whether the tuner times the FFMA kind beside cuBLASLt's for the product under the current
// KILN_TUNE: one launch, its split-K sums and epilogue hook (a ReLU's mask) inside it.
bool lt_times_ffma(const LtMatmul& g, int device);

// Whether the tuner times the tile engine's kernels beside cuBLASLt's for the product under the
// current KILN_TUNE (a large exact-f32 one on sm_90). They sum no bias gradient, so a weight
// gradient's product is then run apart from its bias gradient's column sums.
bool lt_times_tile_engine(const LtMatmul& g, int device);

// What the tuner remembers the product's choice by (its operands' addresses count only by their
// alignment): tests store a choice under it.
rt::TuneKey lt_tune_key(const LtMatmul& g, int device);

// A product that runs the GEMM family's row kind (kernels::GemmKernel::rowdot): its launch and
// operands as the kind sees them (D^T's rows: the product's n, one warp each).
struct RowProduct {
  GemmLaunch launch;
  GemmOperands operands;
};
// The row kind's launch where it is the product's settled choice; in a shape-only pass, its
// candidate where the first call will time it. Else none.
std::optional<RowProduct> lt_row_product(const LtMatmul& g, const rt::Stream& s);

}  // namespace kiln::kernels
