// kernels::gemm: the engine's row-major, strided view of a batched GEMM mapped onto
// cuBLAS's column-major cublasGemmStridedBatchedEx without copying any operand.

#include "gemm.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "backend/blas_layout.h"
#include "check.h"
#include "cublas_loader.h"
#include "gemm_lt.h"
#include "kiln/error.h"
#include "kiln/runtime/cublas.h"
#include "kiln/runtime/kernel_plan.h"
#include "kiln/runtime/memory.h"

namespace kiln::kernels {

namespace {

std::atomic<bool> g_allow_tf32{false};

struct CublasTypes {
  cudaDataType data;
  cublasComputeType_t compute;
  bool f64;  // alpha/beta are double for CUBLAS_COMPUTE_64F, float otherwise
};

CublasTypes cublas_types(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return {CUDA_R_32F, allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, false};
    case DType::f64:
      return {CUDA_R_64F, CUBLAS_COMPUTE_64F, true};
    case DType::f16:
      return {CUDA_R_16F, CUBLAS_COMPUTE_32F, false};
    case DType::bf16:
      return {CUDA_R_16BF, CUBLAS_COMPUTE_32F, false};
    default:
      throw DTypeError("[gemm] dtype " + std::string(dtype_name(dtype)) +
                       " is not supported on the GPU (f32, f64, f16, bf16)");
  }
}

// A host scalar in the scale type cuBLAS reads for the compute type.
struct ScaleArg {
  float f;
  double d;
  ScaleArg(double v) : f(static_cast<float>(v)), d(v) {}
  const void* ptr(const CublasTypes& t) const { return t.f64 ? static_cast<const void*>(&d) : &f; }
};

void* device_ptr(rt::DevicePtr p) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)); }

cublasOperation_t op_of(const blas::BlasOperand& o) { return o.trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

cublasHandle_t handle_for(const rt::Stream& s) {
  // cuBLAS works in the calling thread's current context: make it the stream's device.
  rt::make_current(s.device());
  return static_cast<cublasHandle_t>(rt::cublas_handle(s));
}

// C = beta * C as a k = 1 GEMM of zero vectors: cuBLAS scales (beta == 0 zeroes C unread)
// and 0*0 keeps any NaN in A or B out of the result.
void scale_output(DType dtype, const CublasTypes& t, const GemmShape& sh, double beta, const GemmOperand& c,
                  const blas::BlasGemm& g, const rt::Stream& s) {
  if (beta == 1 || rt::shape_only()) return;
  const std::size_t bytes = static_cast<std::size_t>(std::max(g.m, g.n)) * dtype_size(dtype);
  rt::DeviceBuffer zeros(bytes, s);
  rt::memset_device(zeros.ptr(), 0, bytes, s);
  const ScaleArg zero(0.0), be(beta);
  // Column-major: C^T is (g.n x g.m) = zeros(g.n x 1) @ zeros(1 x g.m) + beta * C^T.
  KILN_CUBLAS(cublasGemmStridedBatchedEx_64(handle_for(s), CUBLAS_OP_N, CUBLAS_OP_N, g.n, g.m, 1, zero.ptr(t),
                                            device_ptr(zeros.ptr()), t.data, g.n, 0, device_ptr(zeros.ptr()), t.data, 1,
                                            0, be.ptr(t), device_ptr(c.ptr), t.data, g.c.ld, c.batch_stride, sh.batch,
                                            t.compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

bool gemm_layout_ok(std::int64_t rows, std::int64_t cols, std::int64_t row_stride, std::int64_t col_stride) {
  return blas::blas_operand(rows, cols, row_stride, col_stride).has_value();
}

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

namespace {

// compute-sanitizer's initcheck does not see cuBLAS's stores on sm_90: it reports every read of
// a fresh f16/bf16 GEMM output although the values equal the CPU's (`kiln_test_helper
// gemm-probe`). With KILN_INITCHECK_GEMM=1 a dense output is zeroed first, so an initcheck run
// reports only reads that kiln itself leaves uninitialised.
void zero_for_initcheck(DType dtype, const GemmShape& sh, const GemmOperand& c, const rt::Stream& s) {
  static const bool on = [] {
    const char* v = std::getenv("KILN_INITCHECK_GEMM");
    return v && std::string(v) == "1";
  }();
  if (!on) return;
  const bool dense_rows = (c.col_stride == 1 && c.row_stride == sh.n) || (c.row_stride == 1 && c.col_stride == sh.m);
  if (!dense_rows || (sh.batch > 1 && c.batch_stride != sh.m * sh.n)) return;
  rt::memset_device(c.ptr, 0, static_cast<std::size_t>(sh.batch * sh.m * sh.n) * dtype_size(dtype), s);
}

}  // namespace

bool gemm(DType dtype, const GemmShape& sh, double alpha, const GemmOperand& a, const GemmOperand& b, double beta,
          const GemmOperand& c, const rt::Stream& s) {
  if (sh.batch < 0 || sh.m < 0 || sh.n < 0 || sh.k < 0)
    throw ShapeError("[gemm] negative size: batch=" + std::to_string(sh.batch) + " m=" + std::to_string(sh.m) +
                     " n=" + std::to_string(sh.n) + " k=" + std::to_string(sh.k));
  const CublasTypes t = cublas_types(dtype);
  if (sh.batch == 0 || sh.m == 0 || sh.n == 0) return true;
  if (sh.batch > 1 && c.batch_stride == 0)
    throw ValueError("[gemm] the output cannot broadcast over a batch of " + std::to_string(sh.batch));

  if (sh.k == 0 || alpha == 0) {
    auto g = blas::blas_output(sh.m, sh.n, c.row_stride, c.col_stride);
    if (!g) return false;
    scale_output(dtype, t, sh, beta, c, *g, s);
    return true;
  }

  auto g = blas::blas_gemm(sh.m, sh.n, sh.k, a.row_stride, a.col_stride, b.row_stride, b.col_stride, c.row_stride,
                           c.col_stride);
  if (!g) return false;
  // g is the row-major call first(m x k) @ second(k x n); in column-major that is
  // C^T(n x m) = second^T @ first^T, so cuBLAS takes `second` as its A.
  const GemmOperand& first = g->swap_ab ? b : a;
  const GemmOperand& second = g->swap_ab ? a : b;
  if (beta == 0) zero_for_initcheck(dtype, sh, c, s);
  const ScaleArg al(alpha), be(beta);
  // A single product C = A @ B goes through cuBLASLt, whose algorithm is measured per shape and
  // remembered (gemm_lt.h): cublasGemmEx's default pick ran matmul's 784-wide TF32 products at
  // 0.7x of the best. Otherwise, or when cuBLASLt has no algorithm, cublasGemmEx: its heuristics
  // can pick a faster kernel than the batched entry point does for batch 1.
  if (sh.batch == 1 && alpha == 1 && beta == 0 && dtype != DType::f64) {
    const LtMatmul lt{.dtype = dtype,
                      .m = g->n,
                      .n = g->m,
                      .k = g->k,
                      .trans_a = g->b.trans,
                      .trans_b = g->a.trans,
                      .lda = g->b.ld,
                      .ldb = g->a.ld,
                      .ldd = g->c.ld,
                      .a = second.ptr,
                      .b = first.ptr,
                      .d = c.ptr};
    if (lt_matmul(lt, s)) return true;  // in a shape-only pass: its generated candidates planned
  }
  if (rt::shape_only()) return true;  // cuBLAS's own pick: nothing to plan or run
  if (sh.batch == 1) {
    KILN_CUBLAS(cublasGemmEx_64(handle_for(s), op_of(g->b), op_of(g->a), g->n, g->m, g->k, al.ptr(t),
                                device_ptr(second.ptr), t.data, g->b.ld, device_ptr(first.ptr), t.data, g->a.ld,
                                be.ptr(t), device_ptr(c.ptr), t.data, g->c.ld, t.compute, CUBLAS_GEMM_DEFAULT));
    return true;
  }
  KILN_CUBLAS(cublasGemmStridedBatchedEx_64(
      handle_for(s), op_of(g->b), op_of(g->a), g->n, g->m, g->k, al.ptr(t), device_ptr(second.ptr), t.data, g->b.ld,
      second.batch_stride, device_ptr(first.ptr), t.data, g->a.ld, first.batch_stride, be.ptr(t), device_ptr(c.ptr),
      t.data, g->c.ld, c.batch_stride, sh.batch, t.compute, CUBLAS_GEMM_DEFAULT));
  return true;
}

}  // namespace kiln::kernels
