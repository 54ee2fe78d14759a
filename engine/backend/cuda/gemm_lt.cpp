// kernels::lt_matmul: cuBLASLt products with fused epilogues, their descriptors and chosen
// algorithm cached per configuration.
#include "gemm_lt.h"

#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "check.h"
#include "gemm.h"
#include "kiln/error.h"
#include "kiln/runtime/cublas.h"
#include "kiln/runtime/graph.h"
#include "kiln/runtime/kernel_plan.h"

namespace kiln::kernels {

namespace {

// KILN_GEMM_AUTOTUNE=1 turns autotuning on from the start (benchmarks, a trainer run).
std::atomic<bool> g_autotune{[] {
  const char* v = std::getenv("KILN_GEMM_AUTOTUNE");
  return v && std::string(v) == "1";
}()};

struct LtTypes {
  cudaDataType data, scale;
  cublasComputeType_t compute;
};

LtTypes lt_types(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return {CUDA_R_32F, CUDA_R_32F, allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F};
    case DType::f64:
      return {CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_64F};
    case DType::f16:
      return {CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F};
    case DType::bf16:
      return {CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F};
    default:
      throw DTypeError("[linear] dtype " + std::string(dtype_name(dtype)) +
                       " is not supported by cuBLASLt (f32, f64, f16, bf16)");
  }
}

cublasLtEpilogue_t lt_epilogue(LtEpilogue e) {
  switch (e) {
    case LtEpilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case LtEpilogue::relu_bias: return CUBLASLT_EPILOGUE_RELU_BIAS;
    case LtEpilogue::bgrad_b: return CUBLASLT_EPILOGUE_BGRADB;
    case LtEpilogue::none: break;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// Alignment in bytes (at most 16) of a pointer; the heuristic may pick vectorised kernels.
std::uint32_t alignment(rt::DevicePtr p) {
  std::uint32_t a = 16;
  while (a > 1 && p % a != 0) a /= 2;
  return a;
}

using Key = std::tuple<int, DType, std::int64_t, std::int64_t, std::int64_t, bool, bool, std::int64_t, std::int64_t,
                       std::int64_t, LtEpilogue, std::uint32_t, std::uint32_t, std::uint32_t, std::uint32_t>;

// Descriptors of one configuration and its algorithm; `found` false: cuBLASLt has none.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  std::vector<cublasLtMatmulHeuristicResult_t> candidates;
  cublasLtMatmulAlgo_t algo{};
  bool found = false, tuned = false;
};

struct Plans {
  std::mutex mu;
  std::map<Key, Plan> by_key;  // never erased: descriptors live for the process
};

void release(Plan& p) {
  if (p.op) cublasLtMatmulDescDestroy(p.op);
  for (cublasLtMatrixLayout_t l : {p.a, p.b, p.d})
    if (l) cublasLtMatrixLayoutDestroy(l);
  p = Plan{};
}

Plans& plans() {
  static auto* p = new Plans;
  return *p;
}

void set_attr(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attr, const void* v, std::size_t size) {
  KILN_CUBLAS(cublasLtMatmulDescSetAttribute(op, attr, v, size));
}

Plan make_plan(const LtMatmul& g, const LtTypes& t, const rt::GemmWorkspace& ws, const Key& key, int device) {
  Plan p;
  KILN_CUBLAS(cublasLtMatmulDescCreate(&p.op, t.compute, t.scale));
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_attr(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  set_attr(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
  const cublasLtEpilogue_t epi = lt_epilogue(g.epilogue);
  set_attr(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
  // Stored shapes: op(A) is m x k, so A is k x m when transposed; likewise B.
  KILN_CUBLAS(cublasLtMatrixLayoutCreate(&p.a, t.data, static_cast<std::uint64_t>(g.trans_a ? g.k : g.m),
                                         static_cast<std::uint64_t>(g.trans_a ? g.m : g.k), g.lda));
  KILN_CUBLAS(cublasLtMatrixLayoutCreate(&p.b, t.data, static_cast<std::uint64_t>(g.trans_b ? g.n : g.k),
                                         static_cast<std::uint64_t>(g.trans_b ? g.k : g.n), g.ldb));
  KILN_CUBLAS(cublasLtMatrixLayoutCreate(&p.d, t.data, static_cast<std::uint64_t>(g.m),
                                         static_cast<std::uint64_t>(g.n), g.ldd));
  cublasLtMatmulPreference_t pref = nullptr;
  KILN_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  const std::uint64_t max_ws = ws.bytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof max_ws);
  const std::uint32_t al_a = std::get<11>(key), al_b = std::get<12>(key), al_d = std::get<13>(key);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d);
  p.candidates.resize(gemm_autotune() ? 16 : 1);  // the heuristic's first choice, or candidates to time
  int returned = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      static_cast<cublasLtHandle_t>(rt::cublaslt_handle(device)), p.op, p.a, p.b, p.d, p.d, pref,
      static_cast<int>(p.candidates.size()), p.candidates.data(), &returned);
  cublasLtMatmulPreferenceDestroy(pref);
  p.candidates.resize(st == CUBLAS_STATUS_SUCCESS ? static_cast<std::size_t>(returned) : 0);
  p.found = !p.candidates.empty();
  if (p.found) p.algo = p.candidates.front().algo;
  return p;
}

struct Scale {
  float f;
  double d;
  explicit Scale(double v) : f(static_cast<float>(v)), d(v) {}
  const void* ptr(const LtTypes& t) const { return t.scale == CUDA_R_64F ? static_cast<const void*>(&d) : &f; }
};

void* vp(rt::DevicePtr p) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)); }

void launch(const Plan& p, const cublasLtMatmulAlgo_t& algo, const LtMatmul& g, const LtTypes& t,
            const rt::GemmWorkspace& ws, const rt::Stream& s) {
  if (g.epilogue != LtEpilogue::none) {
    void* bias = vp(g.bias);
    set_attr(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
  }
  const Scale one(1.0), zero(0.0);
  KILN_CUBLAS(cublasLtMatmul(static_cast<cublasLtHandle_t>(rt::cublaslt_handle(s.device())), p.op, one.ptr(t), vp(g.a),
                             p.a, vp(g.b), p.b, zero.ptr(t), vp(g.d), p.d, vp(g.d), p.d, &algo, vp(ws.ptr), ws.bytes,
                             static_cast<cudaStream_t>(s.handle())));
}

// Runs each candidate (one warm-up, then 3 timed) and keeps the fastest.
void autotune(Plan& p, const LtMatmul& g, const LtTypes& t, const rt::GemmWorkspace& ws, const rt::Stream& s) {
  p.tuned = true;
  if (p.candidates.size() < 2) return;
  rt::Event start = rt::Event::create(s.device(), true), stop = rt::Event::create(s.device(), true);
  float best = -1;
  for (const auto& c : p.candidates) {
    launch(p, c.algo, g, t, ws, s);
    start.record(s);
    for (int i = 0; i < 3; ++i) launch(p, c.algo, g, t, ws, s);
    stop.record(s);
    stop.synchronize();
    const float ms = stop.elapsed_ms_since(start);
    if (best < 0 || ms < best) {
      best = ms;
      p.algo = c.algo;
    }
  }
}

}  // namespace

void set_gemm_autotune(bool on) { g_autotune.store(on, std::memory_order_relaxed); }
bool gemm_autotune() { return g_autotune.load(std::memory_order_relaxed); }

bool lt_matmul(const LtMatmul& g, const rt::Stream& s) {
  const LtTypes t = lt_types(g.dtype);
  if (g.m == 0 || g.n == 0) return true;
  if (g.k == 0) return false;  // cuBLASLt wants k >= 1; the caller's general path handles it
  const rt::GemmWorkspace ws = rt::cublas_workspace(s);
  const Key key{s.device(), g.dtype,   g.m, g.n, g.k, g.trans_a, g.trans_b, g.lda, g.ldb, g.ldd, g.epilogue,
                alignment(g.a), alignment(g.b), alignment(g.d), g.bias ? alignment(g.bias) : 16u};
  Plans& ps = plans();
  std::lock_guard lock(ps.mu);
  auto it = ps.by_key.find(key);
  if (it == ps.by_key.end()) it = ps.by_key.emplace(key, make_plan(g, t, ws, key, s.device())).first;
  Plan& p = it->second;
  if (!p.found) return false;
  if (rt::shape_only()) return true;  // planned (the heuristic's choice kept), run nothing
  if (gemm_autotune() && !p.tuned && !rt::thread_capturing()) {
    if (p.candidates.size() < 2) {  // planned before autotuning was on: ask for candidates
      release(p);
      p = make_plan(g, t, ws, key, s.device());
    }
    autotune(p, g, t, ws, s);
  }
  launch(p, p.algo, g, t, ws, s);
  return true;
}

}  // namespace kiln::kernels
