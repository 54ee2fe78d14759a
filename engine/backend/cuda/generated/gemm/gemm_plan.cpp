// The GEMM family's plans, its module per launch (keyed by the kind, tile, stages and the
// geometry; the source built on a miss) and its launch with the operands' TMA descriptors.
#include "gemm_plan.h"

#include <algorithm>
#include <array>
#include <span>

#include "backend/cuda/launch_common.h"
#include "gemm_internal.h"
#include "kiln/error.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/templates.h"
#include "kiln/runtime/tensor_map.h"

namespace kiln::kernels {

namespace {

constexpr int kBarrierBytes = 2 * 8;  // a full and an empty mbarrier per stage
constexpr int kAlignSlack = 1024;     // the kernel rounds its tiles up to a 1024-byte boundary

struct HookPointers {
  rt::DevicePtr epi[kMaxHookInputs], pro[kMaxHookInputs], stats, totals, odd;
};

// The epilogue's inputs in hooks_of's order: a built-in epilogue's bias is its first.
std::array<rt::DevicePtr, kMaxHookInputs> epilogue_pointers(const GemmLaunch& l, const GemmOperands& ops) {
  std::array<rt::DevicePtr, kMaxHookInputs> p = ops.epilogue_inputs;
  if (l.g.epilogue != GemmEpilogue::none) p[0] = ops.bias;
  return p;
}

// Malformed hooks, or hooks that do not fit the problem: the caller's mistake, not a kind that
// does not apply.
void check_hooks(const GemmGeometry& g) {
  if (const std::string p = hook_problem(g.hooks); !p.empty()) throw ValueError("[gemm] " + p);
  if (g.epilogue != GemmEpilogue::none && g.hooks.epilogue)
    throw ValueError("[gemm] a built-in epilogue and an epilogue hook cannot both be given");
  if (g.hooks.epilogue)
    for (const HookInput& in : g.hooks.epilogue->inputs)
      if (in.index == HookIndex::element && in.ld < g.n)
        throw ValueError("[gemm] epilogue input '" + in.name + "': row stride " + std::to_string(in.ld) +
                         " is shorter than a row of " + std::to_string(g.n));
}

// A GEMM's operands as TMA reads them: 16-byte strides, no overlap between problems.
bool operands_apply(const GemmGeometry& g) {
  // TF32 MMAs read K-major tiles only from shared memory: an MN-major B is taken transposed, as
  // A in registers (plan()); an MN-major A only where a batch shares it (a 1x1 convolution's
  // weights), staged K-major once per launch.
  if (tf32_mma(g.math) && g.a_mn && !stage_a_transposed(g)) return false;
  const DType t = input_dtype(g.math);
  if ((!stage_a_transposed(g) && !rt::tensor_map_fits(0, t, g.lda, g.batch > 1 ? g.batch_a : 0)) ||
      !rt::tensor_map_fits(0, t, g.ldb, g.batch > 1 ? g.batch_b : 0))
    return false;
  if (g.lda < (g.a_mn ? g.m : g.k) || g.ldb < (g.b_mn ? g.n : g.k) || g.ldd < g.n) return false;
  // Problems whose operands overlap (0: every problem reads the same A or B) or outputs overlap.
  auto apart = [&](std::int64_t stride, std::int64_t span) { return stride == 0 || stride >= span; };
  return g.batch == 1 || (apart(g.batch_a, (g.a_mn ? g.k : g.m) * g.lda) &&
                          apart(g.batch_b, (g.b_mn ? g.k : g.n) * g.ldb) && g.batch_d >= g.m * g.ldd);
}

// The module's kind, "gemm_" and the kernel's name: static text, as GeneratedKey keeps a view of it.
const char* module_kind(GemmKernel k) {
  static const char* kinds[] = {"gemm_wgmma", "gemm_mma", "gemm_ffma", "gemm_rowdot"};  // by GemmKernel's value
  return kinds[static_cast<int>(k)];
}

std::span<const rt::KernelSpec* const> module_of(const GemmLaunch& l) {
  rt::GeneratedKey key(module_kind(l.kernel));
  key.add(l.bm, l.bn, l.stages, l.group_m, l.grid, l.box.w, l.box.h, l.splits, l.transposed, l.cluster);
  l.g.add_to(key);
  return rt::generated_kernels(key, [&] {
    return rt::GeneratedModule{source(l), "gemm " + l.text() + " " + math_name(l.g.math), entry_points(l)};
  });
}

}  // namespace

// Whether the epilogue stores through shared memory, 16 bytes a lane along D's rows (line-sized
// writes instead of a request per row and pair of columns). Only where a tile has at most 4 k
// tiles, so that its stores rival its loads (1x1 convs, short products): elsewhere the second
// pass over the accumulators would cost compile time (about 0.1 s) and win nothing. Every 16
// bytes of a tile's row must start 16-byte aligned and lie side by side in D, and nothing may
// read D back or sum it (accumulating and statistics epilogues store as before). Weight
// gradients sum over every pixel: their partials are never staged.
bool staged_stores(const GemmLaunch& l) {
  const GemmGeometry& g = l.g;
  // The built-in epilogues neither accumulate nor take statistics: only a hook can.
  const bool reads_back = g.hooks.epilogue && (g.hooks.epilogue->accumulate || g.hooks.epilogue->stats != HookStats::none);
  if ((g.conv && g.conv->weight_grad) || l.transposed || reads_back) return false;
  const std::int64_t bk = 128 / static_cast<std::int64_t>(dtype_size(input_dtype(g.math)));
  const std::int64_t k_tiles = g.conv ? g.conv->r * g.conv->s * ceil_div(staged_channels(g), bk)
                                      : ceil_div(ceil_div(g.k, bk), l.splits);
  const std::int64_t per = 16 / static_cast<std::int64_t>(split_k(l) ? 4 : dtype_size(output_dtype(g)));
  const std::int64_t batch_d = split_k(l) ? g.m * g.ldd : g.batch > 1 ? g.batch_d : 0;
  if (k_tiles > 4 || g.ldd % per != 0 || batch_d % per != 0) return false;
  return !g.conv || (l.box.w % per == 0 && g.conv->ow() % per == 0);
}

namespace {

// Shared memory beside the stages: column statistics add each consumer warp's column sums and
// squares, reduced across warps; staged stores take 16 rows of 128 bytes per consumer warp;
// f32 math split in the kernel the lo tiles it writes.
std::int64_t scratch_bytes(const GemmLaunch& l) {
  const std::int64_t stats = column_sums(l) ? (l.bm / 64) * 4 * l.bn * 2 * 4 : 0;
  // f32 math split in the kernel: two sets of lo tiles (none of A's where it is in registers).
  const std::int64_t lo = split_in_kernel(l.g) ? 2 * ((reg_a(l) ? 0 : l.bm) * 128 + l.bn * 128) : 0;
  return stats + lo + (staged_stores(l) ? l.bm * 128 : 0) + kAlignSlack;
}

// Paired f32 slices: each stage holds its k tile's lo tiles too.
std::int64_t stage_bytes(const GemmLaunch& l) {
  return (l.bm + l.bn) * 128 * (l.g.conv && l.g.conv->paired ? 2 : 1) + kBarrierBytes;
}

}  // namespace

std::int64_t shared_bytes(const GemmLaunch& l, int stages) { return stages * stage_bytes(l) + scratch_bytes(l); }

// As many stages as fit beside the tiles, at most 8: deeper buys nothing once loads hide.
int stages_for(const GemmLaunch& l, const GemmTarget& t) {
  // The scratch is worked out once: convs plan their launches on every call.
  const std::int64_t room = t.max_shared - scratch_bytes(l);
  const std::int64_t s = std::min<std::int64_t>(8, room / stage_bytes(l));
  return s >= 2 ? static_cast<int>(s) : 0;
}

HookStats stats_of(const GemmGeometry& g) {
  return g.hooks.epilogue ? g.hooks.epilogue->stats : HookStats::none;
}

bool column_sums(const GemmLaunch& l) {
  const HookStats s = stats_of(l.g);
  return s == HookStats::columns || (s == HookStats::rows && l.transposed);
}

const char* math_name(GemmMath m) {
  static const char* names[] = {"bf16", "f16", "tf32", "f32"};
  return names[static_cast<int>(m)];
}

DType input_dtype(GemmMath m) {
  static const DType dtypes[] = {DType::bf16, DType::f16, DType::f32, DType::f32};
  return dtypes[static_cast<int>(m)];
}

bool tf32_mma(GemmMath m) { return m == GemmMath::tf32 || m == GemmMath::f32; }

const char* epilogue_name(GemmEpilogue e) {
  static const char* names[] = {"none", "bias", "relu_bias"};
  return names[static_cast<int>(e)];
}

const char* kernel_name(GemmKernel k) {
  switch (k) {
    case GemmKernel::mma_sync:
      return "mma";
    case GemmKernel::ffma:
      return "ffma";
    case GemmKernel::rowdot:
      return "rowdot";
    case GemmKernel::wgmma:
      break;
  }
  return "wgmma";
}

GemmTarget gemm_target(int device) {
  const rt::DeviceInfo& info = rt::device_info(device);
  return {info.arch(), info.sm_count, info.max_shared_optin};
}

void GemmGeometry::add_to(rt::GeneratedKey& key) const {
  key.add(m, n, k, lda, ldb, ldd, math, epilogue, a_mn, b_mn, batch, batch_a, batch_b, batch_d);
  if (conv)
    key.add(conv->c, conv->h, conv->w, conv->r, conv->s, conv->pad_h, conv->pad_w, conv->flip, conv->weight_grad,
            conv->k_major, conv->paired, conv->split_gy);
  hooks.add_to(key);
}

GemmHooks hooks_of(const GemmGeometry& g) {
  GemmHooks h = g.hooks;
  if (g.epilogue == GemmEpilogue::none) return h;
  GemmEpilogueHook e;
  e.expr = g.epilogue == GemmEpilogue::bias ? "acc + bias" : "kiln::math::relu(acc + bias)";
  e.inputs = {HookInput{"bias", input_dtype(g.math), HookIndex::column}};
  h.epilogue = e;
  return h;
}

DType output_dtype(const GemmGeometry& g) {
  if (g.conv && g.conv->f32_out) return DType::f32;
  return g.hooks.epilogue && g.hooks.epilogue->out ? *g.hooks.epilogue->out : input_dtype(g.math);
}

std::string GemmGeometry::text() const {
  std::string t;
  for (std::int64_t v : {m, n, k, lda, ldb, ldd}) t += std::to_string(v) + " ";
  t.append(math_name(math)).append(" ").append(epilogue_name(epilogue));
  if (a_mn) t.append(" A^T");
  if (b_mn) t.append(" B^T");
  if (batch > 1)
    for (std::int64_t v : {batch, batch_a, batch_b, batch_d}) t.append(" ").append(std::to_string(v));
  if (conv)
    for (std::int64_t v : {conv->c, conv->h, conv->w, conv->r, conv->s, conv->pad_h, conv->pad_w})
      t.append(v == conv->c ? " conv " : " ").append(std::to_string(v));
  if (conv && conv->flip) t.append(" flip");
  if (conv && conv->weight_grad) t.append(" wgrad");
  if (conv && conv->k_major) t.append(" K");
  if (conv && conv->paired) t.append(" P");
  if (conv && conv->split_gy) t.append(" G");
  if (conv && conv->f32_out) t.append(" F");
  return t + hooks.text();
}

std::string GemmTile::text() const {
  if (bm == 0) return {};
  return std::to_string(bm) + "x" + std::to_string(bn) + (splits > 1 ? " k" + std::to_string(splits) : std::string()) +
         (transposed ? " T" : "") + (cluster ? " C" : "");
}

std::string GemmLaunch::text() const {
  return std::string(kernel_name(kernel)) + " " + std::to_string(bm) + "x" + std::to_string(bn) + " s" +
         std::to_string(stages) + (splits > 1 ? " k" + std::to_string(splits) : std::string()) +
         (transposed ? " T" : "") + (cluster ? " C" : "") + (g.conv && g.conv->k_major ? " K" : "") +
         (g.conv && g.conv->paired ? " P" : "") + (g.conv && g.conv->split_gy ? " G" : "");
}

bool split_k(const GemmLaunch& l) { return !l.g.conv && l.splits > 1 && l.kernel != GemmKernel::ffma; }

bool reg_a(const GemmLaunch& l) { return l.transposed && !l.g.conv; }

std::optional<GemmLaunch> plan(GemmKernel k, const GemmGeometry& g, const GemmTarget& target, GemmTile tile) {
  check_hooks(g);
  if (k == GemmKernel::mma_sync) return plan_mma(g, target, tile);
  if (k == GemmKernel::ffma) return plan_ffma(g, target, tile);
  if (k == GemmKernel::rowdot) return plan_rowdot(g, target, tile);
  if (target.arch != 90 || g.m < 1 || g.n < 1 || g.k < 1 || g.batch < 1) return std::nullopt;
  if (g.conv ? !conv_fits(g) : !operands_apply(g)) return std::nullopt;
  if (g.conv && g.conv->f32_out && (!g.conv->weight_grad || tf32_mma(g.math))) return std::nullopt;
  GemmLaunch l;
  l.g = g;
  if (g.conv && g.conv->weight_grad) return plan_wgrad(l, target, tile);
  // Wide tiles where the output fills the SMs with them; narrower where it would not. An
  // MN-major B comes in atoms of 64 columns. Convolution mode sizes its tile to its box of
  // output pixels, and takes 64 rows where the output has no more channels.
  l.bm = 128;
  const GemmHooks hooks = hooks_of(g);
  const bool hookless = !hooks.epilogue && !hooks.prologue;
  // TF32 with B MN-major: tiles of D^T, B's rows as A read into registers (no hooks).
  const bool reg_a = !g.conv && tf32_mma(g.math) && g.b_mn;
  if (reg_a && (!hookless || (tile.bm > 0 && !tile.transposed))) return std::nullopt;
  // Convolution mode's tiles of D^T take no hooks but D's row statistics (their columns' sums).
  const bool transposable = hookless || row_statistics_alone(hooks);
  if (tile.transposed && ((!g.conv && !reg_a) || !transposable)) return std::nullopt;
  l.transposed = reg_a || (g.conv && transposable && (tile.bm > 0 ? tile.transposed : g.m <= 32));
  const int min_bn = g.b_mn && !reg_a ? 64 : 16;  // B's atoms (transposed, B is A's matrix)
  if (l.transposed) {  // up to BM of D's columns (output pixels) as rows; D's rows, in 16s, as columns
    l.bm = tile.bm > 0 ? tile.bm : 128;
    l.bn = static_cast<int>(ceil_div(std::min<std::int64_t>(g.m, 256), 16) * 16);
    if (g.conv) l.box = conv_box(*g.conv, l.bm);
    const std::int64_t columns = g.conv ? conv_tiles_n(g, 0, l.box) : ceil_div(g.n, l.bm);
    if (tile.bm == 0 && g.batch * columns * ceil_div(g.m, l.bn) < target.sm_count) {
      l.bm = 64;
      if (g.conv) l.box = conv_box(*g.conv, 64);
    }
  } else if (g.conv) {
    if (g.m <= 64) l.bm = 64;
    const int most = tile.bn > 0 ? tile.bn : 256;
    l.box = conv_box(*g.conv, most);
    if (tile.bn == 0 && g.batch * ceil_div(g.m, l.bm) * conv_tiles_n(g, 0, l.box) < target.sm_count)
      l.box = conv_box(*g.conv, 128);
    l.bn = static_cast<int>(ceil_div(l.box.w * l.box.h, 16) * 16);
    if (tile.bm > 0) l.bm = tile.bm;
  } else {
    l.bn = g.n <= 64 ? std::max<int>(min_bn, static_cast<int>(ceil_div(g.n, 16) * 16)) : g.n <= 128 ? 128 : 256;
    if (l.bn == 256 && g.batch * ceil_div(g.m, 128) * ceil_div(g.n, 256) < target.sm_count) l.bn = 128;
    if (tile.bm > 0) l.bm = tile.bm, l.bn = tile.bn;
  }
  if ((l.bm != 64 && l.bm != 128) || l.bn < min_bn || l.bn > 256 || l.bn % min_bn != 0) return std::nullopt;
  const std::int64_t columns = g.conv ? conv_tiles_n(g, l.bn, l.box) : ceil_div(g.n, l.transposed ? l.bm : l.bn);
  const std::int64_t tiles = g.batch * columns * ceil_div(g.m, l.transposed ? l.bn : l.bm);
  if (tiles > (std::int64_t{1} << 31) - 1) return std::nullopt;
  if (tile.splits > 1) {  // every split has k tiles; the partials need a plain dense product
    // (the partials are summed with 32-bit indices)
    if (g.conv || l.transposed || g.batch != 1 || !hookless || g.ldd != g.n || g.m * g.n >= (std::int64_t{1} << 31))
      return std::nullopt;
    const std::int64_t k_tiles = ceil_div(g.k, 128 / static_cast<std::int64_t>(dtype_size(input_dtype(g.math))));
    l.splits = static_cast<int>(ceil_div(k_tiles, ceil_div(k_tiles, tile.splits)));
  }
  l.stages = stages_for(l, target);  // the store staging depends on the splits
  if (l.stages == 0) return std::nullopt;
  l.shared_bytes = shared_bytes(l, l.stages);
  l.grid = static_cast<int>(std::min<std::int64_t>(tiles * l.splits, std::max(1, target.sm_count)));
  return l;
}

std::vector<GemmTile> alternatives(const GemmLaunch& h, const GemmTarget& target) {
  if (h.kernel == GemmKernel::mma_sync) return mma_alternatives(h);
  if (h.kernel == GemmKernel::ffma) return ffma_alternatives(h, target);
  if (h.kernel == GemmKernel::rowdot) return rowdot_alternatives(h);
  std::vector<GemmTile> out;
  if (h.g.conv) {  // both heights of tile by boxes of at most 128 or 256 pixels (wgrad: columns)
    // K-major weight gradients: this width, and one tap (or one tile of a tap) a tile.
    const bool wgrad = h.g.conv->weight_grad;
    const WgradLayout w = wgrad_layout(h.g);
    for (int bm : {64, 128})
      for (int bn : w.k_major ? std::array{h.bn, w.bn} : std::array{128, 256})
        if ((h.transposed || bm != h.bm || (wgrad ? bn != h.bn : (bn == 128) != (h.bn <= 128))) &&
            (out.empty() || out.back().bm != bm || out.back().bn != bn))
          out.push_back({bm, bn});
    // Up to 64 channels: transposed tiles too, 64 or 128 of D's columns high.
    const GemmHooks hk = hooks_of(h.g);
    if (h.g.m <= 64 && ((!hk.epilogue && !hk.prologue) || row_statistics_alone(hk)))
      for (int bm : {64, 128})
        if (!h.transposed || bm != h.bm) out.push_back({bm, 0, 0, true});
    return out;
  }
  if (h.transposed) {  // A in registers: the other height of tile
    out.push_back({h.bm == 64 ? 128 : 64, 0, 0, true});
    return out;
  }
  for (GemmTile c : {GemmTile{128, 256}, GemmTile{128, 128}, GemmTile{128, 64}, GemmTile{64, 128}})
    if ((c.bm != h.bm || c.bn != h.bn) && c.bn < 2 * h.g.n + 16) out.push_back(c);
  // A product whose tiles fill under half the SMs: its k split to fill them, and half that.
  const std::int64_t tiles = ceil_div(h.g.m, h.bm) * ceil_div(h.g.n, h.bn), sms = std::max(1, target.sm_count);
  const std::int64_t k_tiles = ceil_div(h.g.k, 128 / static_cast<std::int64_t>(dtype_size(input_dtype(h.g.math))));
  const std::int64_t ways = std::min(sms / tiles, k_tiles / 2);
  if (h.g.batch == 1 && 2 * tiles < sms && ways >= 2)
    for (std::int64_t s : {ways, ways / 2})
      if (s >= 2) out.push_back({h.bm, h.bn, static_cast<int>(s)});
  return out;
}

GemmStatsShape stats_shape(const GemmLaunch& l) {
  const GemmGeometry& g = l.g;
  switch (stats_of(g)) {
    case HookStats::rows:
      if (l.transposed) {  // column sums of D^T's tiles: per problem, tile of D's columns and consumer
        if (g.m <= l.bn) return {l.grid * (l.bm / 64), g.m};  // one tile spans the channels: a CTA's sums
        return {g.batch * (g.conv ? conv_tiles_n(g, l.bn, l.box) : ceil_div(g.n, l.bm)) * (l.bm / 64), g.m};
      }
      if (g.m <= l.bm) return {l.grid, g.m};
      return {g.batch * (g.conv ? conv_tiles_n(g, l.bn, l.box) : ceil_div(g.n, l.bn)), g.m};
    case HookStats::columns:
      if (g.n <= l.bn) return {l.grid * (l.bm / 64), g.n};
      return {g.batch * ceil_div(g.m, l.bm) * (l.bm / 64), g.n};
    case HookStats::none: break;
  }
  return {};
}

bool hook_inputs_given(const std::vector<HookInput>& inputs,
                       const std::array<rt::DevicePtr, kMaxHookInputs>& pointers) {
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (pointers[i] == 0 || pointers[i] % dtype_size(inputs[i].dtype) != 0) return false;
  return true;
}

bool operands_fit(const GemmLaunch& l, const GemmOperands& ops) {
  if (l.kernel == GemmKernel::mma_sync) return mma_operands_fit(l, ops);
  if (l.kernel == GemmKernel::ffma) return ffma_operands_fit(l, ops);
  if (l.kernel == GemmKernel::rowdot) return rowdot_operands_fit(l, ops);
  const DType t = input_dtype(l.g.math);
  const WgradLayout w = wgrad_layout(l.g);
  const bool a_fits = stage_a_transposed(l.g) ? ops.a % dtype_size(t) == 0 : rt::tensor_map_fits(ops.a, t, l.g.lda);
  if (l.g.conv ? ops.a == 0 || ops.b == 0 || (!w.stage_gy && w.k_major && ops.a % 16 != 0) ||
                     (!w.stage_images && w.k_major && ops.b % 16 != 0)
               : ops.a == 0 || !a_fits || !rt::tensor_map_fits(ops.b, t, l.g.ldb))
    return false;
  if (ops.d % 16 != 0) return false;
  const GemmHooks h = hooks_of(l.g);
  return (!h.epilogue || hook_inputs_given(h.epilogue->inputs, epilogue_pointers(l, ops))) &&
         (!h.prologue || hook_inputs_given(h.prologue->inputs, ops.prologue_inputs)) &&
         (stats_of(l.g) == HookStats::none || (ops.stats != 0 && ops.stats % 4 == 0 && ops.totals % 8 == 0));
}

std::vector<std::string> entry_points(const GemmLaunch& l) {
  // The staging kernels compile apart (GemmStaging): a module holds its tile kernel only.
  return {std::string("kiln_gemm_") + kernel_name(l.kernel)};
}

void launch(const GemmLaunch& l, const GemmOperands& ops) {
  if (!ops.stream) throw ValueError("[gemm] launch needs a stream");
  if (!operands_fit(l, ops))
    throw ValueError("[gemm] " + l.text() + ": operands must be 16-byte aligned, and the bias, every hook input and "
                     "the statistics given");
  if (l.kernel == GemmKernel::mma_sync)
    return launch_mma(l, ops, rt::generated_function(module_of(l), "kiln_gemm_mma", ops.stream->device()));
  if (l.kernel == GemmKernel::ffma)
    return launch_ffma(l, ops, rt::generated_function(module_of(l), "kiln_gemm_ffma", ops.stream->device()));
  if (l.kernel == GemmKernel::rowdot)
    return launch_rowdot(l, ops, rt::generated_function(module_of(l), "kiln_gemm_rowdot", ops.stream->device()));
  const DType t = input_dtype(l.g.math);
  const int box_k = static_cast<int>(128 / dtype_size(t));
  // A K-major operand in boxes of (tile rows) x (k of one stage); an MN-major one in atoms of
  // (k of one stage) x 64 columns.
  auto map = [&](rt::DevicePtr p, bool mn, std::int64_t rows, std::int64_t ld, std::int64_t batch_stride, int tile) {
    const std::int64_t b = l.g.batch > 1 && batch_stride > 0 ? l.g.batch : 1, bs = b > 1 ? batch_stride : 0;
    return mn ? rt::tiled_tensor_map_128b(p, t, l.g.k, rows, ld, box_k, box_k, b, bs)  // atoms of 128 bytes
              : rt::tiled_tensor_map_128b(p, t, rows, l.g.k, ld, tile, box_k, b, bs);
  };
  const std::span<const rt::KernelSpec* const> module = module_of(l);
  const int device = ops.stream->device();
  rt::TensorMap map_a, map_b;
  ConvStaging staged;  // the convolution modes' copies, alive until the kernels are queued
  rt::DeviceBuffer parts;  // weight-gradient mode's and split-K's f32 partials, one D per split
  rt::DevicePtr d = ops.d;
  const bool summed = (l.g.conv && l.g.conv->weight_grad) || split_k(l);  // added after the kernel
  if (summed) {
    const std::int64_t cols = l.g.conv ? l.g.conv->r * l.g.conv->s * wgrad_layout(l.g).channels : l.g.n;
    parts = rt::DeviceBuffer(static_cast<std::size_t>(l.splits * l.g.m * cols) * 4, *ops.stream);
    d = parts.ptr();
  }
  // TF32 with A MN-major: A staged K-major.
  rt::DeviceBuffer a_t;
  rt::DevicePtr a = ops.a;
  std::int64_t lda = l.g.lda;
  if (stage_a_transposed(l.g)) {
    a_t = transpose_a(l, ops);
    a = a_t.ptr(), lda = l.g.k;
  }
  const bool a_mn = l.g.a_mn && !stage_a_transposed(l.g);
  if (l.g.conv) {
    staged = stage_conv(l, ops);
    map_a = staged.map_a, map_b = staged.map_b;
  } else if (l.transposed) {  // the kernel's A is B's matrix (BM of D's columns), its B A's
    map_a = map(ops.b, l.g.b_mn, l.g.n, l.g.ldb, l.g.batch_b, l.bm);
    map_b = map(a, a_mn, l.g.m, lda, l.g.batch_a, l.bn);
  } else {
    map_a = map(a, a_mn, l.g.m, lda, l.g.batch_a, l.bm);
    map_b = map(ops.b, l.g.b_mn, l.g.n, l.g.ldb, l.g.batch_b, l.bn);
  }
  const rt::Function fn = rt::generated_function(module, "kiln_gemm_wgmma", device);
  rt::LaunchConfig cfg;
  cfg.grid.x = static_cast<unsigned>(l.grid);
  cfg.block.x = static_cast<unsigned>((l.bm / 64 + 1) * 128);
  cfg.shared_bytes = static_cast<unsigned>(l.shared_bytes);
  HookPointers hp{};  // laid out as the kernel's HookPointers
  const auto epi = epilogue_pointers(l, ops);
  for (int i = 0; i < kMaxHookInputs; ++i) hp.epi[i] = epi[static_cast<std::size_t>(i)];
  for (int i = 0; i < kMaxHookInputs; ++i) hp.pro[i] = ops.prologue_inputs[static_cast<std::size_t>(i)];
  hp.stats = ops.stats;
  hp.totals = ops.totals;
  hp.odd = staged.odd.ptr();
  void* args[] = {const_cast<rt::TensorMap*>(&map_a), const_cast<rt::TensorMap*>(&map_b), &d, &hp};
  rt::launch_raw(fn, cfg, *ops.stream, args);
  if (summed)
    sum_splits(l, parts.ptr(), ops.d, *ops.stream);
}

}  // namespace kiln::kernels
