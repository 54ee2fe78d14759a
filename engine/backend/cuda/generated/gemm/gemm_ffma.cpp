// The GEMM family's FFMA kind (kernel_templates/gemm_ffma.cu): plain products on the CUDA cores
// with f32 sums (exact f32, or bf16/f16 inputs), any arch, A and B K-major or MN-major, the
// built-in epilogues or a pointwise epilogue hook, k split among blocks whose partials the last
// of a tile adds in order (one kernel). Its plan, tile alternatives, source, operand check and
// launch.
#include <algorithm>
#include <string>

#include "backend/cuda/launch_common.h"
#include "gemm_internal.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/templates.h"

namespace kiln::kernels {

namespace {

constexpr int kFfmaBK = 16;  // k per staged tile, as the template's kBK
constexpr int kMostSplits = 16;
constexpr int kMostClusterSplits = 8;  // the portable cluster size

// Whether an operand's rows are copied 4 elements at a time: the contiguous dimension and the row
// stride multiples of 4 (the base's alignment is operands_fit's).
bool vectors_fit(bool mn, std::int64_t rows, std::int64_t k, std::int64_t ld) {
  return (mn ? rows : k) % 4 == 0 && ld % 4 == 0;
}

// An epilogue hook the kind runs: a pointwise expression in the inputs' dtype, without
// statistics or accumulation; no prologue.
bool hooks_fit(const GemmHooks& h) {
  if (h.prologue) return false;
  if (!h.epilogue) return true;
  const GemmEpilogueHook& e = *h.epilogue;
  return e.stats == HookStats::none && !e.accumulate && !e.out;
}

// The hook's operands as the kernel's HookPointers lays them out.
struct FfmaHookPointers {
  rt::DevicePtr epi[kMaxHookInputs], pro[kMaxHookInputs];
};

bool tile_fits(int bm, int bn) {
  const int threads = (bm / 4) * (bn / 4);
  return bm >= 16 && bn >= 16 && bm <= 64 && bn <= 64 && (bm & (bm - 1)) == 0 && (bn & (bn - 1)) == 0 && threads >= 64;
}

std::int64_t tiles_of(const GemmGeometry& g, int bm, int bn) { return ceil_div(g.m, bm) * ceil_div(g.n, bn); }

// Splits that fill the SMs `waves` times with `tiles` tiles, each split keeping two k tiles or
// more.
std::int64_t filling_splits(std::int64_t tiles, std::int64_t k_tiles, const GemmTarget& target, int waves = 1) {
  const std::int64_t most = std::max<std::int64_t>(1, std::min<std::int64_t>(kMostSplits, k_tiles / 2));
  return std::clamp<std::int64_t>(waves * std::max(1, target.sm_count) / tiles, 1, most);
}

}  // namespace

// Tiles as wide as the columns need, up to 64, then 64 rows high, or 32 where that leaves over
// half the SMs idle; k split so that the blocks fill the SMs once, each split keeping two or
// more k tiles. On sm_90 a split tile's blocks are a cluster (at most 8 splits), split to fill
// the SMs twice: two such blocks an SM hide each other's waits (the mlp's k = 512 products at
// batch 128 on an H200: 6.8 us in 8 splits, 9.5-9.7 in 4).
std::optional<GemmLaunch> plan_ffma(const GemmGeometry& g, const GemmTarget& target, GemmTile tile) {
  if (g.math == GemmMath::tf32 || g.conv || !hooks_fit(g.hooks) || g.batch != 1 || tile.transposed) return std::nullopt;
  if (g.m < 1 || g.n < 1 || g.k < 1 || g.lda < (g.a_mn ? g.m : g.k) || g.ldb < (g.b_mn ? g.n : g.k) || g.ldd < g.n)
    return std::nullopt;
  GemmLaunch l;
  l.kernel = GemmKernel::ffma;
  l.g = g;
  const int sms = std::max(1, target.sm_count);
  if (tile.bm > 0) {
    l.bm = tile.bm, l.bn = tile.bn;
  } else {
    l.bn = g.n <= 16 ? 16 : g.n <= 32 ? 32 : 64;
    l.bm = 64;
    if (l.bn == 64 && 2 * tiles_of(g, l.bm, l.bn) < sms) l.bm = 32;
  }
  if (!tile_fits(l.bm, l.bn)) return std::nullopt;
  const std::int64_t tiles = tiles_of(g, l.bm, l.bn), k_tiles = ceil_div(g.k, kFfmaBK);
  if (ceil_div(g.m, l.bm) > 65535 || ceil_div(g.n, l.bn) > 65535) return std::nullopt;
  std::int64_t want = tile.splits > 0 ? tile.splits : filling_splits(tiles, k_tiles, target);
  const bool heuristic_cluster = tile.bm == 0 && target.arch >= 90 && want > 1;
  if (heuristic_cluster) want = std::min<std::int64_t>(filling_splits(tiles, k_tiles, target, 2), kMostClusterSplits);
  if (want < 1 || want > 64) return std::nullopt;
  l.splits = static_cast<int>(ceil_div(k_tiles, ceil_div(k_tiles, want)));  // every split has k tiles
  l.cluster = tile.cluster || heuristic_cluster;
  if (l.cluster && (target.arch < 90 || l.splits < 2 || l.splits > kMostClusterSplits)) {
    if (tile.cluster) return std::nullopt;
    l.cluster = false;
  }
  l.stages = 4;                                                             // the template's kStages
  l.grid = static_cast<int>(tiles * l.splits);
  return l;
}

std::vector<GemmTile> ffma_alternatives(const GemmLaunch& h, const GemmTarget& target) {
  std::vector<GemmTile> out;
  const std::int64_t k_tiles = ceil_div(h.g.k, kFfmaBK);
  for (GemmTile t :
       {GemmTile{64, 64}, GemmTile{32, 64}, GemmTile{64, 32}, GemmTile{32, 32}, GemmTile{64, 16}, GemmTile{16, 64}}) {
    if (t.bn > 2 * h.g.n + 16) continue;
    const std::int64_t fill = filling_splits(tiles_of(h.g, t.bm, t.bn), k_tiles, target);
    for (std::int64_t s : {fill, 2 * fill, fill / 2}) {
      if (s < 1 || s > std::max<std::int64_t>(1, k_tiles / 2)) continue;
      // Each split tile as a cluster too, on sm_90 (the heuristic's launch with its other form).
      for (const bool cluster : {false, true}) {
        const std::int64_t splits = cluster ? std::min<std::int64_t>(s, kMostClusterSplits) : s;
        const GemmTile c{t.bm, t.bn, static_cast<int>(splits), false, cluster};
        const bool heuristic = t.bm == h.bm && t.bn == h.bn && splits == h.splits && cluster == h.cluster;
        if (heuristic || (cluster && (target.arch < 90 || splits < 2))) continue;
        if (std::none_of(out.begin(), out.end(), [&](const GemmTile& o) {
              return o.bm == c.bm && o.bn == c.bn && o.splits == c.splits && o.cluster == c.cluster;
            }))
          out.push_back(c);
      }
    }
  }
  return out;
}

std::string ffma_source(const GemmLaunch& l) {
  const GemmGeometry& g = l.g;
  auto num = [](std::int64_t v) { return std::to_string(v); };
  const bool vec_a = vectors_fit(g.a_mn, g.m, g.k, g.lda), vec_b = vectors_fit(g.b_mn, g.n, g.k, g.ldb);
  rt::Bindings b = plain_product_bindings(l);
  const DType t = input_dtype(g.math);
  b.insert(b.end(), {{"PRELUDE", prelude_for(g, g.hooks)},
                     {"HOOK_FUNCTIONS", hook_source(g.hooks).functions},
                     {"IN", std::string(cuda_storage_type(t))},
                     {"SPLITK", num(l.splits)},
                     {"CLUSTER", l.cluster ? "1" : "0"},
                     {"VEC_A", vec_a ? "4" : "1"},
                     {"VEC_B", vec_b ? "4" : "1"},
                     {"TILES", num(std::max<std::int64_t>(1, tiles_of(g, l.bm, l.bn)))}});
  return rt::instantiate("gemm_ffma", rt::template_source("gemm_ffma"), b);
}

// Bases aligned to 4 elements where the kernel copies 4 at a time, to one elsewhere.
bool ffma_operands_fit(const GemmLaunch& l, const GemmOperands& ops) {
  const GemmGeometry& g = l.g;
  const std::uint64_t size = dtype_size(input_dtype(g.math));
  auto aligned = [size](rt::DevicePtr p, bool vec) { return p != 0 && p % ((vec ? 4 : 1) * size) == 0; };
  if (g.hooks.epilogue && !hook_inputs_given(g.hooks.epilogue->inputs, ops.epilogue_inputs)) return false;
  return aligned(ops.a, vectors_fit(g.a_mn, g.m, g.k, g.lda)) && aligned(ops.b, vectors_fit(g.b_mn, g.n, g.k, g.ldb)) &&
         aligned(ops.d, false) && (g.epilogue == GemmEpilogue::none || aligned(ops.bias, false));
}

void launch_ffma(const GemmLaunch& l, const GemmOperands& ops, const rt::Function& fn) {
  rt::LaunchConfig cfg;
  cfg.grid = {static_cast<unsigned>(ceil_div(l.g.n, l.bn)), static_cast<unsigned>(ceil_div(l.g.m, l.bm)),
              static_cast<unsigned>(l.splits)};
  cfg.block = {static_cast<unsigned>((l.bm / 4) * (l.bn / 4)), 1, 1};
  // The splits' partial tiles, taken from the stream's pool in stream order (a cluster's stay in
  // its blocks' shared memory).
  rt::DeviceBuffer parts;
  if (l.splits > 1 && !l.cluster)
    parts = rt::DeviceBuffer(static_cast<std::size_t>(l.grid) * static_cast<std::size_t>(l.bm * l.bn) * 4, *ops.stream);
  FfmaHookPointers hp{};
  for (int i = 0; i < kMaxHookInputs; ++i) hp.epi[i] = ops.epilogue_inputs[static_cast<std::size_t>(i)];
  rt::launch(fn, cfg, *ops.stream, ops.a, ops.b, ops.d, ops.bias, parts.ptr(), hp);
}

}  // namespace kiln::kernels
