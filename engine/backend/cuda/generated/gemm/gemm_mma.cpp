// The GEMM family's mma.sync kind for sm_80 and later (kernel_templates/gemm_mma.cu): its plan,
// tile alternatives, source and launch. Plain products only (no convolution modes or hooks):
// 16-bit inputs K-major or MN-major, TF32 and exact f32 K-major, a batch, the built-in epilogues.
#include <algorithm>
#include <array>
#include <string>

#include "backend/cuda/launch_common.h"
#include "gemm_internal.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/templates.h"

namespace kiln::kernels {

namespace {

std::int64_t mma_stage_bytes(int bm, int bn) { return static_cast<std::int64_t>(bm + bn) * 128; }

// Whether the operands are read in whole 16-byte chunks: every row along the contiguous
// dimension, every row stride and batch stride a multiple of one, and the rows long enough.
bool chunks_fit(const GemmGeometry& g) {
  const std::int64_t chunk = 16 / static_cast<std::int64_t>(dtype_size(input_dtype(g.math)));
  auto whole = [&](bool mn, std::int64_t rows, std::int64_t ld, std::int64_t stride) {
    return (mn ? rows : g.k) % chunk == 0 && ld % chunk == 0 && ld >= (mn ? rows : g.k) &&
           (g.batch == 1 || stride % chunk == 0);
  };
  return whole(g.a_mn, g.m, g.lda, g.batch_a) && whole(g.b_mn, g.n, g.ldb, g.batch_b) && g.ldd >= g.n;
}

}  // namespace

// Tiles of 128 x 128, narrowed (N first, then M) while the tiles leave SMs idle; as many stages,
// up to 4, as fit.
std::optional<GemmLaunch> plan_mma(const GemmGeometry& g, const GemmTarget& target, GemmTile tile) {
  if (target.arch < 80 || g.conv || g.hooks.epilogue || g.hooks.prologue) return std::nullopt;
  if ((tf32_mma(g.math) && (g.a_mn || g.b_mn)) || !chunks_fit(g) || g.batch > 65535 || tile.splits > 1 ||
      tile.transposed)
    return std::nullopt;
  if (g.batch > 1 && (g.batch_d < g.m * g.ldd || (g.batch_a != 0 && g.batch_a < (g.a_mn ? g.k : g.m) * g.lda) ||
                      (g.batch_b != 0 && g.batch_b < (g.b_mn ? g.k : g.n) * g.ldb)))
    return std::nullopt;
  GemmLaunch l;
  l.kernel = GemmKernel::mma_sync;
  l.g = g;
  l.bm = 128, l.bn = 128;
  auto tiles = [&] { return g.batch * ceil_div(g.m, l.bm) * ceil_div(g.n, l.bn); };
  if (tile.bm > 0) {
    l.bm = tile.bm, l.bn = tile.bn;
  } else {
    if (tiles() < target.sm_count) l.bn = 64;
    if (tiles() < target.sm_count) l.bm = 64;
  }
  if ((l.bm != 64 && l.bm != 128) || (l.bn != 64 && l.bn != 128)) return std::nullopt;
  if (ceil_div(g.m, l.bm) > 65535 || ceil_div(g.n, l.bn) > (std::int64_t{1} << 31) - 1) return std::nullopt;
  l.stages = static_cast<int>(std::min<std::int64_t>(4, target.max_shared / mma_stage_bytes(l.bm, l.bn)));
  if (l.stages < 2) return std::nullopt;
  l.shared_bytes = l.stages * mma_stage_bytes(l.bm, l.bn);
  l.grid = static_cast<int>(std::min<std::int64_t>(tiles(), std::max(1, target.sm_count)));
  return l;
}

std::vector<GemmTile> mma_alternatives(const GemmLaunch& h) {
  std::vector<GemmTile> out;
  for (GemmTile t : {GemmTile{128, 128}, GemmTile{128, 64}, GemmTile{64, 128}, GemmTile{64, 64}})
    if (t.bm != h.bm || t.bn != h.bn) out.push_back(t);
  return out;
}

std::string mma_source(const GemmLaunch& l) {
  const GemmGeometry& g = l.g;
  const DType t = input_dtype(g.math);
  const DType mma_type = g.math == GemmMath::f16 ? DType::f16 : DType::bf16;  // the header mma.cu names
  const DTypes headers = t == DType::f32 ? DTypes{DType::f32, mma_type} : DTypes{t};
  const bool batched = g.batch > 1;
  auto num = [](std::int64_t v) { return std::to_string(v); };
  const int mma = tf32_mma(g.math) ? 2 : g.math == GemmMath::f16 ? 1 : 0;  // the template's MMA
  rt::Bindings b = plain_product_bindings(l);
  b.insert(b.end(), {{"PRELUDE", rt::device_prelude(headers)},
                     {"MMA", num(mma)},
                     {"SPLIT", g.math == GemmMath::f32 ? "true" : "false"},
                     {"MMA_OPS", rt::template_source("mma")},
                     {"IN", std::string(cuda_storage_type(t))},
                     {"STAGES", num(l.stages)},
                     {"BATCH_A", num(batched ? g.batch_a : 0)},
                     {"BATCH_B", num(batched ? g.batch_b : 0)},
                     {"BATCH_D", num(batched ? g.batch_d : 0)}});
  return rt::instantiate("gemm_mma", rt::template_source("gemm_mma"), b);
}

bool mma_operands_fit(const GemmLaunch& l, const GemmOperands& ops) {
  const std::int64_t out = static_cast<std::int64_t>(dtype_size(input_dtype(l.g.math)));
  return ops.a != 0 && ops.b != 0 && ops.a % 16 == 0 && ops.b % 16 == 0 && ops.d != 0 && ops.d % out == 0 &&
         (l.g.epilogue == GemmEpilogue::none || (ops.bias != 0 && ops.bias % out == 0));
}

void launch_mma(const GemmLaunch& l, const GemmOperands& ops, const rt::Function& fn) {
  rt::LaunchConfig cfg;
  cfg.grid = {static_cast<unsigned>(ceil_div(l.g.n, l.bn)), static_cast<unsigned>(ceil_div(l.g.m, l.bm)),
              static_cast<unsigned>(l.g.batch)};
  cfg.block = {static_cast<unsigned>(l.bm / 64 * l.bn / 32 * 32), 1, 1};
  cfg.shared_bytes = static_cast<unsigned>(l.shared_bytes);
  rt::launch(fn, cfg, *ops.stream, ops.a, ops.b, ops.d, ops.bias);
}

}  // namespace kiln::kernels
