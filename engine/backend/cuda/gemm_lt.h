#pragma once
// One GEMM through cuBLASLt, for the products whose epilogue fuses work that would otherwise be
// kernels of its own: a bias (and ReLU) added to the output, or the bias gradient taken as a
// sum over the product's k dimension. Column-major, as cuBLASLt sees it:
//   D (m x n) = op(A) (m x k) @ op(B) (k x n)           [+ bias (m), then ReLU]
//   bias_grad (n) = sum over k of op(B)                    (bgrad_b)
// The chosen algorithm is kept per (device, dtype, sizes, layouts, epilogue, alignment), so a
// shape costs one heuristic query; set_gemm_autotune(true) times the candidates instead.
#include <cstdint>

#include "kiln/dtype.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/memory.h"

namespace kiln::kernels {

enum class LtEpilogue { none, bias, relu_bias, bgrad_b };

struct LtMatmul {
  DType dtype = DType::f32;  // A, B, D and the bias; f16/bf16 accumulate in f32
  std::int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  std::int64_t lda = 0, ldb = 0, ldd = 0;
  LtEpilogue epilogue = LtEpilogue::none;
  rt::DevicePtr a = 0, b = 0, d = 0;
  rt::DevicePtr bias = 0;  // read (bias, relu_bias: m values) or written (bgrad_b: n values)
};

// Enqueues the product on `s`. false, enqueuing nothing, when cuBLASLt has no algorithm for
// it (the caller then takes another path); DTypeError for a dtype it never handles.
[[nodiscard]] bool lt_matmul(const LtMatmul& g, const rt::Stream& s);

// Autotuning: the first call of a configuration outside a capture runs each heuristic
// candidate a few times and keeps the fastest. Off by default: which algorithm wins can vary
// between processes, and with it the rounding of the results. KILN_GEMM_AUTOTUNE=1 turns it on.
void set_gemm_autotune(bool on);
bool gemm_autotune();

}  // namespace kiln::kernels
