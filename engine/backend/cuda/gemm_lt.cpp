// kernels::lt_matmul: cuBLASLt products with fused epilogues, their descriptors and chosen
// algorithm cached per configuration.
#include "gemm_lt.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/generated/gemm/gemm_plan.h"
#include "check.h"
#include "cublas_loader.h"
#include "elementwise_kernels.h"
#include "gemm.h"
#include "gemm_lt_ahead.h"
#include "kiln/error.h"
#include "kiln/runtime/cublas.h"
#include "kiln/runtime/graph.h"
#include "kiln/runtime/kernel_plan.h"
#include "kiln/runtime/tuning.h"
#include "tuner.h"

namespace kiln::kernels {

namespace {

struct LtTypes {
  cudaDataType data, scale;
  cublasComputeType_t compute;
  cudaDataType out = data;  // D's and the bias's
};

LtTypes input_types(DType dtype) {
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

DType out_dtype(const LtMatmul& g) { return g.out.value_or(g.dtype); }

LtTypes lt_types(const LtMatmul& g) {
  LtTypes t = input_types(g.dtype);
  if (out_dtype(g) == g.dtype) return t;
  if ((g.dtype != DType::bf16 && g.dtype != DType::f16) || out_dtype(g) != DType::f32)
    throw DTypeError("[linear] a cuBLASLt product of " + std::string(dtype_name(g.dtype)) + " inputs is written in " +
                     std::string(dtype_name(g.dtype)) + " (or f32, from f16 and bf16), not " +
                     std::string(dtype_name(out_dtype(g))));
  t.out = CUDA_R_32F;
  return t;
}

cublasLtEpilogue_t lt_epilogue(LtEpilogue e) {
  switch (e) {
    case LtEpilogue::bias:
      return CUBLASLT_EPILOGUE_BIAS;
    case LtEpilogue::relu_bias:
      return CUBLASLT_EPILOGUE_RELU_BIAS;
    case LtEpilogue::bgrad_b:
      return CUBLASLT_EPILOGUE_BGRADB;
    case LtEpilogue::none:
    case LtEpilogue::relu_mask:  // kiln's pass after the library's product (mask_output)
      break;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// Alignment in bytes (at most 256, cuBLASLt's default) of a pointer: a smaller figure tells the
// heuristic to leave out the algorithms that need more, Hopper's among them.
std::uint32_t alignment(rt::DevicePtr p) {
  std::uint32_t a = 256;
  while (a > 1 && p % a != 0) a /= 2;
  return a;
}

constexpr int kTuneCandidates = 16;  // cuBLASLt's first picks, timed once per shape

// The compute type is part of the key: a plan's descriptor fixes it (TF32 or exact f32), so a
// process that switches TF32 gets another plan, not the one made under the earlier setting.
using Key = std::tuple<int, DType, DType, std::int64_t, std::int64_t, std::int64_t, bool, bool, std::int64_t,
                       std::int64_t, std::int64_t, LtEpilogue, std::uint32_t, std::uint32_t, std::uint32_t,
                       std::uint32_t, cublasComputeType_t>;
// The key's alignments of A, B, D and the bias.
constexpr std::size_t kAlignA = 12, kAlignB = 13, kAlignD = 14, kAlignBias = 15;

// Descriptors of one configuration and its algorithm; `found` false: cuBLASLt has none.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  std::vector<cublasLtMatmulHeuristicResult_t> candidates;
  cublasLtMatmulAlgo_t algo{};
  std::optional<GemmLaunch> generated;  // the tuner's choice when a generated kernel won
  bool found = false, settled = false;  // settled: the measured or remembered choice is in algo or generated
};

struct Plans {
  std::mutex mu;
  std::map<Key, Plan> by_key;  // never erased: descriptors live for the process
};

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
  if (g.epilogue != LtEpilogue::none && t.out != t.data) {
    const cudaDataType bias_type = t.out;
    set_attr(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type);
  }
  // Stored shapes: op(A) is m x k, so A is k x m when transposed; likewise B.
  KILN_CUBLAS(cublasLtMatrixLayoutCreate(&p.a, t.data, static_cast<std::uint64_t>(g.trans_a ? g.k : g.m),
                                         static_cast<std::uint64_t>(g.trans_a ? g.m : g.k), g.lda));
  KILN_CUBLAS(cublasLtMatrixLayoutCreate(&p.b, t.data, static_cast<std::uint64_t>(g.trans_b ? g.n : g.k),
                                         static_cast<std::uint64_t>(g.trans_b ? g.k : g.n), g.ldb));
  KILN_CUBLAS(
      cublasLtMatrixLayoutCreate(&p.d, t.out, static_cast<std::uint64_t>(g.m), static_cast<std::uint64_t>(g.n), g.ldd));
  cublasLtMatmulPreference_t pref = nullptr;
  KILN_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  const std::uint64_t max_ws = ws.bytes;
  rt::cublas().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws,
                                                    sizeof max_ws);
  const std::uint32_t al_a = std::get<kAlignA>(key), al_b = std::get<kAlignB>(key), al_d = std::get<kAlignD>(key);
  rt::cublas().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                                    sizeof al_a);
  rt::cublas().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                                    sizeof al_b);
  rt::cublas().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d,
                                                    sizeof al_d);
  rt::cublas().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d,
                                                    sizeof al_d);
  // The heuristic's first choice, or candidates to time.
  p.candidates.resize(rt::tune_mode() == rt::TuneMode::off ? 1 : kTuneCandidates);
  int returned = 0;
  const cublasStatus_t st = rt::cublas().cublasLtMatmulAlgoGetHeuristic(
      static_cast<cublasLtHandle_t>(rt::cublaslt_handle(device)), p.op, p.a, p.b, p.d, p.d, pref,
      static_cast<int>(p.candidates.size()), p.candidates.data(), &returned);
  rt::cublas().cublasLtMatmulPreferenceDestroy(pref);
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

// relu_mask after a library product: D = D where the mask is > 0, else 0, in place (one
// elementwise pass of relu_backward's kernel over D's columns).
void mask_output(const LtMatmul& g, const rt::Stream& s) {
  static const rt::KernelSpec& relu_backward = kernel("relu_backward");
  Operand d{g.d, {}}, mask{g.bias, {}};
  d.strides[0] = mask.strides[0] = g.ldd;
  d.strides[1] = mask.strides[1] = 1;
  const std::int64_t shape[] = {g.n, g.m};
  launch_binary(relu_backward, g.dtype, g.dtype, d, mask, d, shape, s);
}

void launch(const Plan& p, const cublasLtMatmulAlgo_t& algo, const LtMatmul& g, const LtTypes& t,
            const rt::GemmWorkspace& ws, const rt::Stream& s) {
  if (g.epilogue != LtEpilogue::none && g.epilogue != LtEpilogue::relu_mask) {
    void* bias = vp(g.bias);
    set_attr(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
  }
  const Scale one(1.0), zero(0.0);
  KILN_CUBLAS(cublasLtMatmul(static_cast<cublasLtHandle_t>(rt::cublaslt_handle(s.device())), p.op, one.ptr(t), vp(g.a),
                             p.a, vp(g.b), p.b, zero.ptr(t), vp(g.d), p.d, vp(g.d), p.d, &algo, vp(ws.ptr), ws.bytes,
                             static_cast<cudaStream_t>(s.handle())));
  if (g.epilogue == LtEpilogue::relu_mask) mask_output(g, s);
}

// An algorithm's configuration as text: what the tuning store remembers it by.
std::string algo_name(const cublasLtMatmulAlgo_t& algo) {
  std::string name;
  auto field = [&](const char* label, cublasLtMatmulAlgoConfigAttributes_t attr, auto value) {
    std::size_t written = 0;
    if (rt::cublas().cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof value, &written) !=
        CUBLAS_STATUS_SUCCESS)
      return;
    if (!name.empty()) name += ' ';
    name.append(label).append(std::to_string(value));
  };
  field("algo", CUBLASLT_ALGO_CONFIG_ID, std::int32_t{0});
  field("tile", CUBLASLT_ALGO_CONFIG_TILE_ID, std::uint32_t{0});
  field("stages", CUBLASLT_ALGO_CONFIG_STAGES_ID, std::uint32_t{0});
  field("splitk", CUBLASLT_ALGO_CONFIG_SPLITK_NUM, std::int32_t{0});
  field("reduction", CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, std::uint32_t{0});
  field("swizzle", CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, std::uint32_t{0});
  field("custom", CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, std::uint32_t{0});
  field("inner", CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, std::uint16_t{0});
  field("cluster", CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, std::uint16_t{0});
  return name;
}

// Some products get a generated kind timed beside cuBLASLt's algorithms even where generated
// kernels are not (KILN_TUNE=auto):
// - Shallow products (k of a few columns: an output layer's input gradient, where TMA's tiles pad
//   most): the FFMA kernel (one launch, its split-K sums in the kernel), its heuristic tile
//   alone. Exact f32 up to 2^27 multiply-adds, 16-bit up to 2^24. On an H200 it won every such
//   product of the mlp, cnn and speedrun (k = 10) and, with its splits parked in global memory,
//   lost every deeper one (k >= 96, by 1.2-2.5x), whose compiles were about 40% of a cold cnn's.
// - Deeper exact-f32 products on sm_90 up to 2^27 multiply-adds: the FFMA kernel again, its
//   split tiles a thread-block cluster (the partials added through distributed shared memory,
//   one launch where cuBLASLt's split-K takes two). At batch 128 on an H200 it ran the mlp's
//   k = 512 products in 6.8 us against cuBLASLt's 8.5 and 8.9 (masked) as graphs, and lost its
//   k = 784 forward (11.9 against 9.4), which the tuner leaves to cuBLASLt.
// - Large exact-f32 products on sm_90: the tile engine's three TF32 products of split operands,
//   every tile (a few compiles, against a product of 0.1 ms or more). Timed with every tile on
//   an H200, it ran the wide MLP's 1024 x 4096 x 4096 products in 0.51-0.53 ms against
//   cuBLASLt's 0.67-0.68 (FFMA), and tied or lost below 2^30 multiply-adds.
// - Products of at most 32 output columns read K-major (an output layer's forward: 10 logits):
//   the row kind, a warp per row summing all of k in one kernel, where cuBLASLt splits k and adds
//   the splits in a second kernel (512 -> 10 at batch 128, exact f32: 5.3 + 4.0 us under ncu).
constexpr std::int64_t kFfmaMeasuredMaxK = 32;
constexpr double kFfmaF32MeasuredMaxMacs = 1 << 27;
constexpr std::int64_t kRowdotMeasuredMaxColumns = 32;
constexpr double kWgmmaF32MeasuredMinMacs = 1 << 30;

bool rowdot_dtype(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

std::optional<GemmKernel> measured_kind_on(const LtMatmul& g, int arch) {
  const double macs = static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  if (out_dtype(g) != g.dtype) return std::nullopt;
  const bool exact_f32 = g.dtype == DType::f32 && !allow_tf32();
  const bool plain =
      g.epilogue == LtEpilogue::none || g.epilogue == LtEpilogue::bias || g.epilogue == LtEpilogue::relu_bias;
  if (plain && g.m <= kRowdotMeasuredMaxColumns && g.trans_a && !g.trans_b && rowdot_dtype(g.dtype))
    return GemmKernel::rowdot;
  if (exact_f32 && macs <= kFfmaF32MeasuredMaxMacs && (g.k <= kFfmaMeasuredMaxK || arch >= 90)) return GemmKernel::ffma;
  if ((g.dtype == DType::bf16 || g.dtype == DType::f16) && g.k <= kFfmaMeasuredMaxK && macs <= 1 << 24)
    return GemmKernel::ffma;
  if (exact_f32 && arch >= 90 && macs >= kWgmmaF32MeasuredMinMacs) return GemmKernel::wgmma;
  return std::nullopt;
}

std::optional<GemmKernel> measured_kind(const LtMatmul& g, int device) {
  return measured_kind_on(g, gemm_target(device).arch);
}

rt::TuneKey tune_key(const Key& key, const LtMatmul& g, int device) {
  const std::array<std::uint32_t, 4> align{std::get<kAlignA>(key), std::get<kAlignB>(key), std::get<kAlignD>(key),
                                           std::get<kAlignBias>(key)};
  // Choices made before a generated kernel was measured beside the library do not stand for these.
  const std::optional<GemmKernel> measured = measured_kind(g, device);
  return {"cublaslt", lt_problem_text(g, align), lt_dtypes_text(g, allow_tf32()), rt::device_info(device).arch(),
          "cublasLt " + std::to_string(rt::cublas().cublasLtGetVersion()) +
              (measured ? std::string(" ") + kernel_name(*measured) : std::string())};
}

// The generated GEMM's view of the product: row-major D^T (n x m) = op(B)^T @ op(A)^T, where
// op(B)^T is K-major unless B is transposed and op(A) K-major when A is; TF32 needs op(B)^T
// K-major (plan() takes an MN-major op(A) transposed, into registers, and declines the rest).
// None for the bias gradient, which it does not sum. relu_mask is an epilogue hook over the
// mask, element (row, col) of D^T at col-major D's (col, row).
std::optional<GemmGeometry> generated_geometry(const LtMatmul& g) {
  if (g.epilogue == LtEpilogue::bgrad_b || out_dtype(g) != g.dtype) return std::nullopt;
  if (g.dtype != DType::bf16 && g.dtype != DType::f16 && g.dtype != DType::f32) return std::nullopt;
  const GemmMath math = g.dtype == DType::f32    ? (allow_tf32() ? GemmMath::tf32 : GemmMath::f32)
                        : g.dtype == DType::bf16 ? GemmMath::bf16
                                                 : GemmMath::f16;
  const GemmEpilogue e = g.epilogue == LtEpilogue::bias        ? GemmEpilogue::bias
                         : g.epilogue == LtEpilogue::relu_bias ? GemmEpilogue::relu_bias
                                                               : GemmEpilogue::none;
  GemmGeometry geo{g.n, g.m, g.k, g.ldb, g.lda, g.ldd, math, e};
  geo.a_mn = g.trans_b;
  geo.b_mn = !g.trans_a;
  if (g.epilogue == LtEpilogue::relu_mask)
    geo.hooks.epilogue = GemmEpilogueHook{.expr = "mask > 0.f ? acc : 0.f",
                                          .inputs = {HookInput{"mask", g.dtype, HookIndex::element, g.ldd}}};
  return geo;
}

// The generated kernels' operands (A and B swapped, as generated_geometry views the product).
GemmOperands generated_operands(const LtMatmul& g, const rt::Stream* s) {
  GemmOperands ops{g.b, g.a, g.d, g.bias, s};
  if (g.epilogue == LtEpilogue::relu_mask) ops.bias = 0, ops.epilogue_inputs[0] = g.bias;
  return ops;
}

// The generated launches worth timing beside cuBLASLt's: under KILN_TUNE=on every tile of every
// kind that applies (they compile first); otherwise the tiles of a kind a stored choice names,
// or measured_kind's one. Exact f32 runs on the CUDA cores, and on sm_90's tensor cores as three
// TF32 products; 16-bit and TF32 on the tensor cores (sm_90: the warpgroup kernels; sm_80 to
// sm_89: the mma.sync ones), small 16-bit products on the CUDA cores too.
std::vector<GemmLaunch> generated_launches(const LtMatmul& g, const rt::TuneKey& key, int device) {
  const std::optional<GemmGeometry> geo = generated_geometry(g);
  const rt::TuneMode mode = rt::tune_mode();
  if (!geo || mode == rt::TuneMode::off) return {};
  const GemmTarget target = gemm_target(device);
  const std::optional<GemmKernel> measured = measured_kind_on(g, target.arch);
  std::vector<GemmKernel> kinds;
  if (geo->math != GemmMath::f32 || target.arch >= 90)
    kinds.push_back(target.arch >= 90 ? GemmKernel::wgmma : GemmKernel::mma_sync);
  if (measured == GemmKernel::ffma || geo->math == GemmMath::f32) kinds.push_back(GemmKernel::ffma);
  if (measured == GemmKernel::rowdot || (mode == rt::TuneMode::on && rowdot_dtype(g.dtype)))
    kinds.push_back(GemmKernel::rowdot);
  const std::optional<rt::TuneChoice> c = mode == rt::TuneMode::on ? std::nullopt : rt::find_choice(key);
  std::vector<GemmLaunch> out;
  for (GemmKernel kind : kinds) {
    const bool named = c && c->variant.rfind(std::string(kernel_name(kind)) + " ", 0) == 0;
    const bool auto_measured = kind == measured;
    if (mode != rt::TuneMode::on && !named && !auto_measured) continue;
    const std::optional<GemmLaunch> h = plan(kind, *geo, target);
    if (!h) continue;
    out.push_back(*h);
    if (mode == rt::TuneMode::on || named || (auto_measured && kind == GemmKernel::wgmma))
      for (GemmTile tile : alternatives(*h, target))
        if (std::optional<GemmLaunch> l = plan(kind, *geo, target, tile)) out.push_back(*l);
  }
  const GemmOperands ops = generated_operands(g, nullptr);
  std::erase_if(out, [&](const GemmLaunch& l) { return !operands_fit(l, ops); });
  return out;
}

void launch_generated(const GemmLaunch& l, const LtMatmul& g, const rt::Stream& s) {
  launch(l, generated_operands(g, &s));
}

// The library's candidates and the generated ones, each writing D (and the bias gradient);
// run_tuned runs the remembered or the fastest.
TuneOutcome run_candidates(std::vector<TuneCandidate> cands, const std::vector<GemmLaunch>& generated,
                           const rt::TuneKey& tkey, const LtMatmul& g, const rt::Stream& s) {
  for (const GemmLaunch& l : generated) cands.push_back({l.text(), [&l, &g, &s] { launch_generated(l, g, s); }});
  TuneCheck check;
  check.outputs.push_back({g.d, out_dtype(g), g.n, g.m, g.ldd});
  if (g.epilogue == LtEpilogue::bgrad_b) check.outputs.push_back({g.bias, out_dtype(g), 1, g.n, g.n});
  // Split-K and reduction orders round differently; a wrong kernel is far off.
  check.tolerance = g.dtype == DType::f64 ? 1e-10 : g.dtype == DType::f32 && !allow_tf32() ? 1e-4 : 2e-2;
  // KILN_TUNE=auto measures measured_kind's kernels as it measures the library's algorithms.
  const TuneCompiles compiles = generated.empty()              ? TuneCompiles::none
                                : measured_kind(g, s.device()) ? TuneCompiles::under_auto
                                                               : TuneCompiles::under_on;
  return run_tuned(tkey, cands, check, s, compiles);
}

void tune(Plan& p, const Key& key, const LtMatmul& g, const LtTypes& t, const rt::GemmWorkspace& ws,
          const rt::Stream& s) {
  std::vector<TuneCandidate> cands;
  for (const auto& c : p.candidates)
    cands.push_back({algo_name(c.algo), [&p, &c, &g, &t, &ws, &s] {
                       if (!rt::shape_only()) launch(p, c.algo, g, t, ws, s);  // a library call: no plan to make
                     }});
  const rt::TuneKey tkey = tune_key(key, g, s.device());
  const std::vector<GemmLaunch> generated = generated_launches(g, tkey, s.device());
  const TuneOutcome out = run_candidates(std::move(cands), generated, tkey, g, s);
  if (out.index < p.candidates.size()) {
    p.algo = p.candidates[out.index].algo;
    p.generated.reset();
  } else {
    p.generated = generated[out.index - p.candidates.size()];
  }
  p.settled = out.settled;
}

// A shape-only pass asks cuBLASLt nothing (its heuristic would need a context): it plans what
// the first real call runs. A choice settled in this process runs its generated kernel, if it
// has one; otherwise the generated candidates and the tuner's checks are planned as if cuBLASLt
// offered several algorithms (a stored choice of the library's matched by its name).
bool plan_product(const Key& key, const LtMatmul& g, const rt::Stream& s) {
  {
    Plans& ps = plans();
    std::lock_guard lock(ps.mu);
    auto it = ps.by_key.find(key);
    if (it != ps.by_key.end() && (it->second.settled || !it->second.found)) {
      if (it->second.generated)
        launch_generated(*it->second.generated, g, s);
      else if (it->second.found && g.epilogue == LtEpilogue::relu_mask)
        mask_output(g, s);
      return it->second.found;
    }
  }
  const rt::TuneKey tkey = tune_key(key, g, s.device());
  const std::vector<GemmLaunch> generated = generated_launches(g, tkey, s.device());
  const std::optional<rt::TuneChoice> stored = rt::find_choice(tkey);
  const bool stored_generated = stored && std::any_of(generated.begin(), generated.end(),
                                                      [&](const GemmLaunch& l) { return l.text() == stored->variant; });
  const std::string library = stored && !stored_generated ? stored->variant : "cuBLASLt";
  // The library's candidates plan their mask pass.
  const auto library_plan = [&g, &s] {
    if (g.epilogue == LtEpilogue::relu_mask) mask_output(g, s);
  };
  run_candidates({{library, library_plan}, {library, library_plan}}, generated, tkey, g, s);
  return true;
}

Key key_of(const LtMatmul& g, const LtTypes& t, int device) {
  return {device,
          g.dtype,
          out_dtype(g),
          g.m,
          g.n,
          g.k,
          g.trans_a,
          g.trans_b,
          g.lda,
          g.ldb,
          g.ldd,
          g.epilogue,
          alignment(g.a),
          alignment(g.b),
          alignment(g.d),
          g.bias ? alignment(g.bias) : 256u,
          t.compute};
}

}  // namespace

bool lt_measures_generated(const LtMatmul& g, int device) { return measured_kind(g, device).has_value(); }

rt::TuneKey lt_tune_key(const LtMatmul& g, int device) { return tune_key(key_of(g, lt_types(g), device), g, device); }

std::optional<RowProduct> lt_row_product(const LtMatmul& g, const rt::Stream& s) {
  if (g.m == 0 || g.n == 0 || g.k == 0 || measured_kind(g, s.device()) != GemmKernel::rowdot) return std::nullopt;
  const Key key = key_of(g, lt_types(g), s.device());
  std::optional<GemmLaunch> l;
  if (rt::shape_only()) {
    // A warm run's stored choice, where it is a row launch (else none: the library runs it);
    // with none stored, the heuristic's, listed first.
    const rt::TuneKey tkey = tune_key(key, g, s.device());
    const std::optional<rt::TuneChoice> choice = rt::find_choice(tkey);
    for (const GemmLaunch& c : generated_launches(g, tkey, s.device()))
      if (c.kernel == GemmKernel::rowdot && (choice ? c.text() == choice->variant : !l)) l = c;
  } else {
    Plans& ps = plans();
    std::lock_guard lock(ps.mu);
    auto it = ps.by_key.find(key);
    if (it != ps.by_key.end() && it->second.settled && it->second.generated &&
        it->second.generated->kernel == GemmKernel::rowdot)
      l = it->second.generated;
  }
  if (!l) return std::nullopt;
  return RowProduct{*l, generated_operands(g, &s)};
}

bool lt_times_ffma(const LtMatmul& g, int device) {
  return rt::tune_mode() != rt::TuneMode::off && measured_kind(g, device) == GemmKernel::ffma;
}

bool lt_times_tile_engine(const LtMatmul& g, int device) {
  return rt::tune_mode() != rt::TuneMode::off && measured_kind(g, device) == GemmKernel::wgmma;
}

bool lt_matmul(const LtMatmul& g, const rt::Stream& s) {
  const LtTypes t = lt_types(g);
  if (g.epilogue == LtEpilogue::relu_mask && (g.bias == 0 || out_dtype(g) != g.dtype || g.dtype == DType::f64))
    throw ValueError("[linear] a ReLU-masked product needs its mask, and D in the f32, f16 or bf16 inputs' dtype");
  if (g.m == 0 || g.n == 0) return true;
  if (g.k == 0) return false;  // cuBLASLt wants k >= 1; the caller's general path handles it
  const Key key = key_of(g, t, s.device());
  if (rt::shape_only()) return plan_product(key, g, s);
  run_reaches_products();
  const rt::GemmWorkspace ws = rt::cublas_workspace(s);
  Plans& ps = plans();
  std::lock_guard lock(ps.mu);
  auto it = ps.by_key.find(key);
  if (it == ps.by_key.end()) it = ps.by_key.emplace(key, make_plan(g, t, ws, key, s.device())).first;
  Plan& p = it->second;
  if (!p.found) return false;
  if (!p.settled) {
    tune(p, key, g, t, ws, s);  // runs the product
    return true;
  }
  if (p.generated)
    launch_generated(*p.generated, g, s);
  else
    launch(p, p.algo, g, t, ws, s);
  return true;
}

}  // namespace kiln::kernels
