// The tuned choice among the generated conv kinds. The heuristic's pick is the reference
// (candidate 0), in the order the kinds were tried before tuning: the GEMM tile engine where
// it applies (16 or more channels either way; with its other tiles), then patch, igemm and
// direct (direct first where an output sums at most 64 products); for weight gradients the
// engine, wgrad, wgrad_small, then igemm. Before sm_90 the engine's 1x1 batches come last.
#include "conv_run.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "backend/cuda/generated/gemm/gemm_plan.h"
#include "backend/cuda/tuner.h"
#include "conv_plan.h"
#include "kiln/error.h"
#include "kiln/runtime/templates.h"

namespace kiln::kernels {

namespace {

// The kernels' sources decide what the candidates are: a changed template is a new question.
const std::string& library_text() {
  static const std::string text = [] {
    std::uint64_t h = rt::kFnvOffset;
    for (const char* name : {"conv_igemm", "conv_ffma", "conv_common", "conv_patch", "conv_wgrad", "conv_wgrad_small",
                             "conv_wgrad_small_mma", "conv_wgrad_small_reduce", "conv_direct", "conv_direct_mma",
                             "conv_stats", "bn_pool_window", "mma", "prelude", "gemm_wgmma"})
      h = rt::fnv1a64(rt::template_source(name), h);
    return "kiln conv " + std::to_string(h);
  }();
  return text;
}

// Elements of the pass's operands (a, b, out).
std::array<std::int64_t, 3> operand_sizes(ConvPass pass, const ConvGeometry& g) {
  const std::int64_t x = g.n * g.c * g.h * g.w, w = g.o * g.cg() * g.kh * g.kw, y = g.n * g.o * g.oh * g.ow;
  if (pass == ConvPass::forward) return {x, w, y};
  if (pass == ConvPass::grad_input) return {y, w, x};
  return {x, y, w};
}

// On the tile engine (sm_90), per image z (P = h*w pixels, NCHW):
//   - a 16-bit 1x1 conv of stride 1 without padding is a batch of GEMMs, its pixel-major
//     operands MN-major: forward y_z (o x P) = w (o x c) @ x_z (c x P), grad_input dx_z = w^T @ gy_z;
//     so is a TF32 or exact f32 forward, its tiles of y_z^T reading x_z into registers (no
//     NHWC copy), and a TF32 grad_input of several images (w^T staged K-major once);
//   - any other conv of stride 1 (no dilation, no groups; bf16, f16, TF32, or exact f32 as
//     three TF32 products of split operands) is convolution mode's implicit GEMM: the forward
//     over x with w, the input gradient over gy with w transposed and flipped, padded by k - 1 - p
//     (exact f32 over channels in 32s with its operands' slices paired: 1.2-1.5x faster than
//     three slices in every tile measured, so the tuner does not time those);
//   - a weight gradient of stride 1 is weight-gradient mode: dw (o x c*r*s) = gy @ the
//     patches of x, summed over every image, in any math (16-bit read K-major with `k_major`,
//     exact f32 through hi and lo copies with `paired`, gy split in the kernel with `split_gy`),
//     a 16-bit one summed into f32 with `f32_out` (so can the small weight-gradient kernel).
// A forward with `totals` also takes its output's per-row (channel) statistics (HookStats::rows).
struct EngineVariant {
  bool k_major = false, paired = false, split_gy = false, f32_out = false, totals = false;
};
std::optional<GemmLaunch> tile_engine_launch(ConvPass pass, const ConvGeometry& g, ConvMath math, int arch,
                                             const ConvTarget& target, GemmTile tile = {}, EngineVariant v = {}) {
  const bool stride1 = g.sh == 1 && g.sw == 1 && g.dh == 1 && g.dw == 1 && g.groups == 1;
  if (!stride1) return std::nullopt;
  const GemmMath gm = math == ConvMath::bf16   ? GemmMath::bf16
                      : math == ConvMath::f16  ? GemmMath::f16
                      : math == ConvMath::tf32 ? GemmMath::tf32
                                               : GemmMath::f32;
  // With few channels either way (o or c, in every pass) its tiles are mostly empty: the older
  // kinds were 2-6x faster on every such row measured (cnn conv1, speedrun sr1).
  if (std::min(g.o, g.c) < 16) return std::nullopt;
  const GemmTarget tgt{arch, target.sm_count, target.max_shared};
  if (pass == ConvPass::grad_weight) {
    GemmConv c;
    c.c = g.c, c.h = g.h, c.w = g.w, c.r = g.kh, c.s = g.kw, c.pad_h = g.ph, c.pad_w = g.pw, c.weight_grad = true;
    c.k_major = v.k_major, c.paired = v.paired, c.split_gy = v.split_gy, c.f32_out = v.f32_out;
    if (c.oh() != g.oh || c.ow() != g.ow) return std::nullopt;
    const std::int64_t taps = g.c * g.kh * g.kw;
    GemmGeometry geo{g.o, taps, g.n * g.oh * g.ow, g.oh * g.ow, g.h * g.w, taps, gm};
    geo.conv = c;
    geo.batch = g.n, geo.batch_a = g.o * g.oh * g.ow, geo.batch_b = g.c * g.h * g.w;
    return plan(GemmKernel::wgmma, geo, tgt, tile);
  }
  const bool forward = pass == ConvPass::forward;
  const std::int64_t rows = forward ? g.o : g.c, k = forward ? g.c : g.o;
  GemmHooks hooks;
  // With few channels the engine tiles D^T (channels as columns), which take the statistics as
  // their columns' sums.
  if (v.totals && forward) hooks.epilogue = GemmEpilogueHook{.stats = HookStats::rows};
  const std::int64_t in_pixels = forward ? g.h * g.w : g.oh * g.ow, out_pixels = forward ? g.oh * g.ow : g.h * g.w;
  const bool tf32_grad_input = gm == GemmMath::tf32 && g.n > 1;  // its w^T is staged for the batch
  if (g.kh == 1 && g.kw == 1 && g.ph == 0 && g.pw == 0 && (!tf32_mma(gm) || forward || tf32_grad_input)) {
    // w is stored (o x c): K-major A for the forward, MN-major (K rows of c) for grad_input.
    GemmGeometry geo{rows, in_pixels, k, g.c, in_pixels, in_pixels, gm};
    geo.a_mn = !forward;
    geo.b_mn = true;
    geo.batch = g.n, geo.batch_a = 0, geo.batch_b = k * in_pixels, geo.batch_d = rows * in_pixels;
    if (g.n == 1) geo.batch_b = geo.batch_d = 0;
    geo.hooks = hooks;
    // Before sm_90, the mma.sync kind takes these plain batches (no convolution modes).
    return plan(arch >= 90 ? GemmKernel::wgmma : GemmKernel::mma_sync, geo, tgt, tile);
  }
  GemmConv c;
  c.c = k, c.h = forward ? g.h : g.oh, c.w = forward ? g.w : g.ow, c.r = g.kh, c.s = g.kw;
  c.pad_h = forward ? g.ph : g.kh - 1 - g.ph, c.pad_w = forward ? g.pw : g.kw - 1 - g.pw, c.flip = !forward;
  c.paired = gm == GemmMath::f32 && k % 32 == 0;
  if (c.pad_h < 0 || c.pad_w < 0 || c.oh() * c.ow() != out_pixels) return std::nullopt;
  GemmGeometry geo{rows, out_pixels, c.r * c.s * k, c.r * c.s * k, in_pixels, out_pixels, gm};
  geo.conv = c;
  geo.batch = g.n, geo.batch_b = k * in_pixels, geo.batch_d = rows * out_pixels;
  geo.hooks = hooks;
  if (auto l = plan(GemmKernel::wgmma, geo, tgt, tile); l || !c.paired) return l;
  geo.conv->paired = false;  // the tile's paired stages did not fit twice
  return plan(GemmKernel::wgmma, geo, tgt, tile);
}

std::int64_t stats_floats(const GemmLaunch& l) { return stats_shape(l).floats(); }

// A candidate's launch, planned once per problem: kernels and tiles do not depend on where the
// operands lie (whether they fit is asked on every call), and eager convs plan on every call.
struct PlannedCandidate {
  std::string name;
  std::variant<GemmLaunch, ConvLaunch> launch;
  // A tile-engine launch whose alternatives follow it: they are skipped with it where the
  // operands do not fit.
  bool head = false;
};

// Whether the patch kind leads the others for this conv: where its forward can take a batch norm's
// statistics (see plan_candidates).
bool patch_leads(const ConvGeometry& g, DType dtype, ConvMath math, const ConvTarget& target) {
  const std::optional<ConvLaunch> forward = plan(ConvKernel::patch, ConvPass::forward, g, dtype, math, target);
  return forward && with_totals(*forward, target);
}

// A forward's output statistics (`totals`) come from the kinds that take them: the engine, the
// patch and the direct kind. An input gradient's pooled batch-norm sums (`pool`) come from the
// patch kind, where it leads: its heuristic's band alone.
std::vector<PlannedCandidate> plan_candidates(ConvPass pass, const ConvGeometry& g, DType dtype, ConvMath math,
                                              const ConvTarget& target, int arch, bool f32_out, bool totals,
                                              const ConvPoolSums* pool) {
  std::vector<PlannedCandidate> c, engine;
  if (pool) {
    const std::optional<ConvLaunch> l = plan(ConvKernel::patch, pass, g, dtype, math, target);
    if (l && patch_leads(g, dtype, math, target))
      if (auto s = with_pool_sums(*l, *pool, target)) c.push_back({"patch pool sums", *s});
    return c;
  }
  auto add_engine = [&](const GemmLaunch& l, EngineVariant v) {
    engine.push_back({"gemm " + l.text(), l, true});
    for (GemmTile tile : alternatives(l, GemmTarget{arch, target.sm_count, target.max_shared}))
      if (const auto a = tile_engine_launch(pass, g, math, arch, target, tile, v))
        engine.push_back({"gemm " + a->text(), *a});
  };
  // An exact f32 weight gradient through hi and lo copies, where it plans: it costs more copying
  // but spares the kernel its split, and the GPU timed it 1.1-1.6x faster in every shape measured
  // (conv2 at batch 128 and 1024, sr2, res64, res128), so the split in the kernel is not timed.
  const std::optional<GemmLaunch> paired =
      pass == ConvPass::grad_weight && math == ConvMath::f32
          ? tile_engine_launch(pass, g, math, arch, target, {}, {.paired = true})
          : std::nullopt;
  if (paired) {
    add_engine(*paired, {.paired = true});
    // And with gy read as stored, its tiles split in the kernel: fewer bytes copied and loaded, a
    // split and a barrier a k tile more.
    if (const auto split = tile_engine_launch(pass, g, math, arch, target, {}, {.paired = true, .split_gy = true}))
      add_engine(*split, {.paired = true, .split_gy = true});
  } else if (const std::optional<GemmLaunch> l =
                 tile_engine_launch(pass, g, math, arch, target, {}, {.f32_out = f32_out, .totals = totals})) {
    add_engine(*l, {.f32_out = f32_out, .totals = totals});
    // A 16-bit weight gradient staged NHWC is also timed read K-major, through the copies TF32
    // reads: which is faster depends on the shape.
    if (pass == ConvPass::grad_weight && !wgrad_layout(l->g).k_major)
      if (const auto k = tile_engine_launch(pass, g, math, arch, target, {}, {.k_major = true, .f32_out = f32_out}))
        add_engine(*k, {.k_major = true, .f32_out = f32_out});
  }
  const double flop = 2.0 * static_cast<double>(g.n * g.o * g.oh * g.ow) * static_cast<double>(g.cg() * g.kh * g.kw);
  const bool fills_gpu = flop > 4e6 * target.sm_count;
  // The small kind's tensor-core kernel leads the weight gradients that do not fill the GPU: one
  // kernel and its reduce, where the engine's runs its layout copies and split sums besides. The
  // tuner (H200, bf16) timed it 10.1 us against the engine's best 14.9 on the speedrun's conv2,
  // 5.9 against 8.6 at batch 64, 7.7 against 9.5 on 16 channels of 16 x 16.
  const std::optional<ConvLaunch> small =
      pass == ConvPass::grad_weight ? plan(ConvKernel::wgrad_small, pass, g, dtype, math, target) : std::nullopt;
  const bool small_leads = small && std::get<SmallWgradPlan>(small->plan).mma && !fills_gpu;
  // The engine's weight-gradient mode and the small kernel write f32 from 16-bit operands.
  if (f32_out) {
    if (small) {
      ConvLaunch l = *small;
      std::get<SmallWgradPlan>(l.plan).f32_out = true;
      engine.insert(small_leads ? engine.begin() : engine.end(), {kernel_name(ConvKernel::wgrad_small), l});
    }
    return engine;
  }
  // Before sm_90 (the mma.sync kind's 1x1 batches) the older kinds stay the untuned pick.
  const bool engine_first = arch >= 90;
  // Where the engine leads and the work fills the GPU, the older kinds were 1.4-27x slower on
  // every row measured (H200, over 4 MFLOP an SM), and their compiles are a tuning's slowest.
  if (engine_first && !engine.empty() && fills_gpu) return engine;
  std::vector<ConvKernel> kinds =
      pass == ConvPass::grad_weight ? std::vector{ConvKernel::wgrad, ConvKernel::wgrad_small, ConvKernel::igemm}
                                    : std::vector{ConvKernel::patch, ConvKernel::igemm, ConvKernel::direct};
  // At most 64 products an output (a first conv's forward), the direct kind leads: the tuner
  // timed it 3.5x faster than the implicit GEMM on the speedrun's conv1 (31.8 -> 9.0 us).
  const std::int64_t products = (pass == ConvPass::forward ? g.cg() : g.o / g.groups) * g.kh * g.kw;
  const bool few_products = pass != ConvPass::grad_weight && products <= 64;
  if (few_products) kinds = {ConvKernel::direct, ConvKernel::patch, ConvKernel::igemm};
  if (totals)
    kinds = few_products ? std::vector{ConvKernel::direct, ConvKernel::patch}
                         : std::vector{ConvKernel::patch, ConvKernel::direct};
  // The older kinds' launches, with the statistics where asked (none where they do not fit).
  auto planned = [&](ConvKernel k, ConvTile tile) {
    std::optional<ConvLaunch> l = plan(k, pass, g, dtype, math, target, tile);
    return l && totals ? with_totals(*l, target) : l;
  };
  // On sm_90 the engine leads the older kinds where the work does not fill the GPU either, but
  // for the leading kinds: the direct one as above, and the patch one, which the tuner timed 2x
  // faster than the engine on the speedrun's conv2 in bf16 on one H200 (forward 10.3 against 23.5
  // us, input gradient 11.7 against 19.6). It leads where its forward can take a batch norm's
  // statistics: a forward's kind (and output bits) are the same with and without them, and the
  // input gradient runs the forward's kind (the engine's forward keeps w reordered for it).
  const bool patch_first = totals || patch_leads(g, dtype, math, target);
  std::vector<PlannedCandidate> after;
  for (ConvKernel k : kinds) {
    const auto h = planned(k, {});
    if (!h || slower_than_fallback(*h)) continue;
    const bool leads = (k == ConvKernel::patch && patch_first) || (k == ConvKernel::direct && few_products) ||
                       (k == ConvKernel::wgrad_small && small_leads);
    std::vector<PlannedCandidate>& to = engine_first && !leads ? after : c;
    to.push_back({kernel_name(k), *h});
    for (ConvTile tile : alternatives(*h, target))
      if (const auto l = planned(k, tile)) to.push_back({std::string(kernel_name(k)) + " " + tile.text(), *l});
  }
  c.insert(c.end(), engine.begin(), engine.end());
  c.insert(c.end(), after.begin(), after.end());
  return c;
}

// The problem's planned candidates, made on its first call. The entries are never removed, so
// a reference stays valid.
const std::vector<PlannedCandidate>& planned_candidates(ConvPass pass, const ConvGeometry& g, DType dtype,
                                                        ConvMath math, const ConvTarget& target, int arch, bool f32_out,
                                                        bool totals, const ConvPoolSums* pool = nullptr) {
  static std::mutex mutex;
  static std::unordered_map<std::string, std::vector<PlannedCandidate>> planned;
  std::string key = std::string(pass_name(pass)) + " " + g.text() + " " + std::string(dtype_name(dtype)) + " " +
                    math_name(math) + " " + std::to_string(arch) + " " + std::to_string(target.sm_count) + " " +
                    std::to_string(target.max_shared) + (f32_out ? " f32 out" : "") + (totals ? " totals" : "");
  if (pool)
    key += " pool " + std::string(dtype_name(pool->p)) + " " + std::to_string(pool->h) + "x" + std::to_string(pool->w) +
           (pool->x % 16 == 0 ? " aligned" : "");
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = planned.find(key);
  if (it == planned.end())
    it = planned.emplace(std::move(key), plan_candidates(pass, g, dtype, math, target, arch, f32_out, totals, pool))
             .first;
  return it->second;
}

// The planned candidates bound to this call's operands; two tiles that plan the same launch
// (boxes of 128 and 256 pixels over a small output) are timed once: the stored choice names a
// launch by its text.
// With `rows`, each candidate's columns of statistics or pooled-sums partials (its blocks; 0 for
// the tile engine's f64 totals or none) beside it.
std::vector<TuneCandidate> candidates(const std::vector<PlannedCandidate>& planned, const ConvOperands& ops,
                                      std::vector<std::int64_t>* rows = nullptr) {
  // w is A and x or gy B; for the weight gradient gy is A and x B.
  GemmOperands gops{ops.b, ops.a, ops.out, 0, ops.stream};
  gops.stats = ops.stats, gops.totals = ops.totals;
  std::vector<TuneCandidate> c;
  bool fits = true;
  for (const PlannedCandidate& p : planned) {
    const auto* gemm = std::get_if<GemmLaunch>(&p.launch);
    if (gemm && p.head) fits = operands_fit(*gemm, gops);
    if ((gemm && !fits) || std::any_of(c.begin(), c.end(), [&](const TuneCandidate& t) { return t.name == p.name; }))
      continue;
    if (gemm) {
      c.push_back({p.name, [gemm, gops] { launch(*gemm, gops); }});
      if (rows) rows->push_back(0);
      continue;
    }
    const ConvLaunch* l = &std::get<ConvLaunch>(p.launch);
    c.push_back({p.name, [l, ops] { launch(*l, ops); }});
    if (rows) rows->push_back(parked_splits(*l));
  }
  return c;
}

}  // namespace

bool generated_convs_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("KILN_CONV_IGEMM");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

bool generated_conv_sums_f32(const ConvGeometry& g, DType dtype, int device) {
  const std::optional<ConvMath> math = conv_math(dtype, dtype, dtype, false);
  if (!math || (*math != ConvMath::bf16 && *math != ConvMath::f16) || !generated_convs_enabled()) return false;
  const std::array<std::int64_t, 3> sizes = operand_sizes(ConvPass::grad_weight, g);
  if (sizes[2] == 0 || std::any_of(sizes.begin(), sizes.end(), [](std::int64_t n) { return n >= INT_MAX / 2; }))
    return false;
  const rt::DeviceInfo& info = rt::device_info(device);
  const ConvTarget target{std::max(1, info.sm_count), std::max(48 * 1024, info.max_shared_optin)};
  return !planned_candidates(ConvPass::grad_weight, g, dtype, *math, target, info.arch(), true, false).empty();
}

namespace {

// The candidates' target, math and plans for a call's operands; none where no generated conv runs
// (generated_convs_enabled's switch, a device before sm_80, an operand past 32-bit indexing, an
// empty output, dtypes without a kind).
struct ConvCall {
  ConvMath math;
  ConvTarget target;
  int arch;
};
std::optional<ConvCall> conv_call(ConvPass pass, const ConvGeometry& g, const ConvOperands& ops, bool tf32) {
  const std::optional<ConvMath> math = conv_math(ops.dtype, ops.dtype, ops.dtype, tf32);
  const std::array<std::int64_t, 3> sizes = operand_sizes(pass, g);
  if (!math || !generated_convs_enabled() || sizes[2] == 0) return std::nullopt;
  if (std::any_of(sizes.begin(), sizes.end(), [](std::int64_t n) { return n >= INT_MAX / 2; })) return std::nullopt;
  const rt::DeviceInfo& info = rt::device_info(ops.stream->device());
  if (info.arch() < 80) return std::nullopt;
  return ConvCall{*math, ConvTarget{std::max(1, info.sm_count), std::max(48 * 1024, info.max_shared_optin)},
                  info.arch()};
}

}  // namespace

std::int64_t generated_conv_stats_floats(const ConvGeometry& g, const ConvOperands& ops, bool tf32) {
  const std::optional<ConvCall> call = conv_call(ConvPass::forward, g, ops, tf32);
  if (!call || ops.f32_out) return 0;
  std::int64_t floats = 0;
  for (const PlannedCandidate& p :
       planned_candidates(ConvPass::forward, g, ops.dtype, call->math, call->target, call->arch, false, true))
    floats = std::max(floats, std::visit([](const auto& l) { return stats_floats(l); }, p.launch));
  return floats;
}

std::int64_t generated_conv_pool_sums_floats(const ConvGeometry& g, const ConvOperands& ops, bool tf32) {
  const std::optional<ConvCall> call = conv_call(ConvPass::grad_input, g, ops, tf32);
  if (!call || !ops.pool_sums) return 0;
  std::int64_t floats = 0;
  for (const PlannedCandidate& p : planned_candidates(ConvPass::grad_input, g, ops.dtype, call->math, call->target,
                                                      call->arch, false, false, ops.pool_sums))
    floats = std::max(floats, 2 * g.c * parked_splits(std::get<ConvLaunch>(p.launch)));
  return floats;
}

ConvRan run_generated_conv(ConvPass pass, const ConvGeometry& g, const ConvOperands& ops, bool tf32) {
  if (ops.f32_out && (pass != ConvPass::grad_weight || (ops.dtype != DType::bf16 && ops.dtype != DType::f16)))
    throw DTypeError(
        std::string("[conv2d] f32 results are written for weight gradients of f16 and bf16 operands, not ") +
        pass_name(pass) + " of " + std::string(dtype_name(ops.dtype)));
  const std::optional<ConvCall> call = conv_call(pass, g, ops, tf32);
  if (!call) return ConvRan::no;
  const ConvMath math = call->math;
  const int arch = call->arch;
  const std::array<std::int64_t, 3> sizes = operand_sizes(pass, g);
  auto planned = [&](bool totals, const ConvPoolSums* pool = nullptr) -> const std::vector<PlannedCandidate>& {
    return planned_candidates(pass, g, ops.dtype, math, call->target, arch, ops.f32_out, totals, pool);
  };
  // With the statistics' buffers (generated_conv_stats_floats of them), the kinds that take
  // them; with a pooled batch norm's (generated_conv_pool_sums_floats), the kind that parks its
  // sums; without, or without such a kind, the conv runs alone.
  ConvOperands with = ops;
  std::vector<TuneCandidate> c;
  std::vector<std::int64_t> rows;
  if (ops.totals != 0 && ops.stats != 0 && pass == ConvPass::forward) c = candidates(planned(true), with, &rows);
  const bool totals = !c.empty();
  if (!totals && ops.pool_sums && ops.pool_sums->parts != 0 && pass == ConvPass::grad_input)
    c = candidates(planned(false, ops.pool_sums), with, &rows);
  const bool pool = !totals && !c.empty();
  if (!totals && !pool) {
    with.stats = with.totals = 0;
    with.pool_sums = nullptr;
    c = candidates(planned(false), with);
  }
  if (c.empty()) return ConvRan::no;
  const std::string dtype =
      std::string(dtype_name(ops.dtype)) + (math == ConvMath::tf32 ? "/tf32" : "") + (ops.f32_out ? "->f32" : "");
  const rt::TuneKey key{
      "conv2d", std::string(pass_name(pass)) + " " + g.text() + (totals ? " totals" : "") + (pool ? " pool sums" : ""),
      dtype, arch, library_text()};
  TuneCheck check;
  check.outputs.push_back({ops.out, ops.f32_out ? DType::f32 : ops.dtype, 1, sizes[2], sizes[2]});
  // Low-precision products summed in other orders and splits; a wrong kernel is far off.
  check.tolerance = ops.dtype == DType::bf16 ? 4e-2 : math == ConvMath::f32 ? 1e-4 : 1e-2;
  // Alternatives cost compiles. The candidate that ran says where its statistics are (a shape-only
  // pass runs the others after it, planning their kernels).
  const TuneOutcome ran = run_tuned(key, c, check, *ops.stream, TuneCompiles::under_on);
  if (totals && ops.stats_rows) *ops.stats_rows = rows[ran.index];
  if (pool && ops.pool_sums->splits) *ops.pool_sums->splits = rows[ran.index];
  return totals ? ConvRan::with_totals : pool ? ConvRan::with_pool_sums : ConvRan::yes;
}

}  // namespace kiln::kernels
