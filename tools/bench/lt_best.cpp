#include "lt_best.h"

#include <cublasLt.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "bench_timing.h"
#include "kiln/runtime/memory.h"

namespace kiln::bench {

namespace {

constexpr std::size_t kWorkspace = std::size_t{32} << 20;

// The cuBLASLt objects of one product, destroyed in reverse.
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    for (cublasLtMatrixLayout_t l : {d, b, a})
      if (l) cublasLtMatrixLayoutDestroy(l);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

cublasLtHandle_t handle() {
  static cublasLtHandle_t h = [] {
    cublasLtHandle_t made = nullptr;
    return cublasLtCreate(&made) == CUBLAS_STATUS_SUCCESS ? made : nullptr;
  }();
  return h;
}

std::string status_text(const char* what, cublasStatus_t s) {
  return std::string(what) + " failed: status " + std::to_string(static_cast<int>(s));
}

}  // namespace

LtBest lt_best(const LtProduct& p, LtPrecision precision, const rt::Stream& stream, int max_algos, int reps,
               int calls) {
  LtBest best;
  if (!handle()) return {-1, 0, "cublasLtCreate failed"};
  const cudaDataType_t dt = precision == LtPrecision::bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t ct = precision == LtPrecision::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  Descs d;
  cublasStatus_t s = cublasLtMatmulDescCreate(&d.op, ct, CUDA_R_32F);
  if (s != CUBLAS_STATUS_SUCCESS) return {-1, 0, status_text("cublasLtMatmulDescCreate", s)};
  const cublasOperation_t ta = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
  if (p.epilogue != LtEpilogue::none) {
    const cublasLtEpilogue_t e = p.epilogue == LtEpilogue::bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_BGRADB;
    cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
    cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof p.bias);
    cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &dt, sizeof dt);
  }
  const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  cublasLtMatrixLayoutCreate(&d.a, dt, u(p.trans_a ? p.k : p.m), u(p.trans_a ? p.m : p.k), p.lda);
  cublasLtMatrixLayoutCreate(&d.b, dt, u(p.trans_b ? p.n : p.k), u(p.trans_b ? p.k : p.n), p.ldb);
  cublasLtMatrixLayoutCreate(&d.d, dt, u(p.m), u(p.n), p.ldd);
  cublasLtMatmulPreferenceCreate(&d.pref);
  cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspace, sizeof kWorkspace);
  std::vector<cublasLtMatmulHeuristicResult_t> found(static_cast<std::size_t>(std::max(1, max_algos)));
  int count = 0;
  s = cublasLtMatmulAlgoGetHeuristic(handle(), d.op, d.a, d.b, d.d, d.d, d.pref, static_cast<int>(found.size()),
                                     found.data(), &count);
  if (s != CUBLAS_STATUS_SUCCESS || count == 0) return {-1, 0, status_text("cublasLtMatmulAlgoGetHeuristic", s)};
  const rt::DeviceBuffer ws(kWorkspace, stream);
  const float one = 1, zero = 0;
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(handle(), d.op, &one, p.a, d.a, p.b, d.b, &zero, p.d, d.d, p.d, d.d, &algo,
                          reinterpret_cast<void*>(ws.ptr()), kWorkspace, static_cast<cudaStream_t>(stream.handle()));
  };
  for (int i = 0; i < count; ++i) {
    if (found[static_cast<std::size_t>(i)].state != CUBLAS_STATUS_SUCCESS) continue;
    const cublasLtMatmulAlgo_t& algo = found[static_cast<std::size_t>(i)].algo;
    if (run(algo) != CUBLAS_STATUS_SUCCESS) continue;  // offered but refused at run time
    const double us = median_event_ms(stream, [&] {
      for (int c = 0; c < calls; ++c) (void)run(algo);
    }, reps, 1) * 1e3 / calls;
    ++best.algos;
    if (best.us < 0 || us < best.us) best.us = us;
  }
  if (best.algos == 0) best.error = "no algorithm ran";
  return best;
}

}  // namespace kiln::bench
