// The implicit-GEMM kind: tiles and split-K for one pass, its source (the template
// instantiated with the shape as constants) and its launch with the split-K workspace.
#include <algorithm>

#include "backend/cuda/launch_common.h"
#include "conv_kinds.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/templates.h"

namespace kiln::kernels::conv_kinds {

namespace {

// Exact f32 sums each split in one running f32 sum of at most this many terms, so a long weight
// gradient (300 images of 64x64: 1.2M terms) rounds no worse than cuBLAS's.
constexpr std::int64_t kFfmaChain = 4096;

}  // namespace

// Narrow products where im2col + cuBLAS measured faster on the H100 than an FFMA tile at least
// 16 wide: a one-channel conv's input gradient (n = 1: 250 vs 36 us for the cnn's conv1) and
// weight gradients of fewer than 32 columns (conv1's 25: 101 vs 92 us).
bool igemm_slower_than_fallback(const ConvLaunch& l) {
  const auto& p = std::get<IgemmPlan>(l.plan);
  return l.math == ConvMath::f32 && (p.gn < 16 || (l.pass == ConvPass::grad_weight && p.gn < 32));
}

// Tiles large enough to feed the tensor cores, small enough to fill the SMs; k split across
// blocks when the output alone leaves most SMs idle (weight gradients).
std::optional<IgemmPlan> plan_igemm(ConvPass pass, const ConvGeometry& s, ConvMath math, const ConvTarget& target,
                                    ConvTile tile) {
  IgemmPlan p;
  const std::int64_t cg = s.cg(), og = s.og(), rs = s.kh * s.kw, sms = std::max(1, target.sm_count);
  if (pass == ConvPass::forward) p.gm = s.n * s.oh * s.ow, p.gn = og, p.gk = cg * rs;
  if (pass == ConvPass::grad_input) p.gm = s.n * s.h * s.w, p.gn = cg, p.gk = og * rs;
  if (pass == ConvPass::grad_weight) p.gm = og, p.gn = cg * rs, p.gk = s.n * s.oh * s.ow;
  if (p.gm == 0 || p.gn == 0 || p.gk == 0) return std::nullopt;  // an empty sum: the fallback writes the zeros
  p.bk = math == ConvMath::tf32 ? 16 : math == ConvMath::f32 ? 8 : 32;
  p.bn = p.gn <= 16 ? 16 : p.gn <= 32 ? 32 : 64;
  p.bm = p.gm <= 32 ? 32 : p.gm <= 64 ? 64 : 128;
  auto tiles = [&] { return ceil_div(p.gm, p.bm) * ceil_div(p.gn, p.bn) * s.groups; };
  if (p.bm == 128 && tiles() < 2 * sms) p.bm = 64;
  if (tile.bm > 0) p.bm = tile.bm, p.bn = tile.bn;
  p.grid_m = ceil_div(p.gm, p.bm);
  p.grid_n = ceil_div(p.gn, p.bn);
  const std::int64_t kt = ceil_div(p.gk, p.bk);
  std::int64_t want = 1;
  if (tiles() < sms && kt >= 8) want = std::min<std::int64_t>({ceil_div(2 * sms, tiles()), kt / 4, 64});
  if (math == ConvMath::f32) want = std::max(want, std::min<std::int64_t>(ceil_div(p.gk, kFfmaChain), 4096));
  want = std::min<std::int64_t>(want, 65535 / s.groups);  // grid.z holds groups * splits
  if (want > 1) {
    const std::int64_t per = ceil_div(kt, want);
    p.splitk = static_cast<int>(ceil_div(kt, per));  // no empty splits: each one counts in
  }
  return p;
}

std::vector<ConvTile> igemm_alternatives(const ConvLaunch& l) {
  const auto& h = std::get<IgemmPlan>(l.plan);
  std::vector<ConvTile> out;
  // Neighbours of the heuristic's tile: half or twice as tall, half or twice as wide.
  for (ConvTile c : {ConvTile{h.bm / 2, h.bn}, ConvTile{h.bm * 2, h.bn}, ConvTile{h.bm, h.bn / 2},
                     ConvTile{h.bm, h.bn * 2}})
    if (c.bm >= 32 && c.bm <= 128 && c.bn >= 16 && c.bn <= 64 && c.bm < 2 * h.gm && c.bn < 2 * h.gn) out.push_back(c);
  return out;
}

std::string igemm_source(const ConvLaunch& l) {
  const auto& p = std::get<IgemmPlan>(l.plan);
  rt::Bindings b = size_bindings(l.g);
  for (auto& kv : rt::Bindings{{"CONV_COMMON", rt::template_source("conv_common")},
                               {"MODE", num(static_cast<int>(l.pass))},
                               {"BM", num(p.bm)},
                               {"BN", num(p.bn)},
                               {"SPLITK", num(p.splitk)},
                               {"TILES", num(p.tiles() * l.g.groups)}})
    b.push_back(std::move(kv));
  if (l.math == ConvMath::f32) {
    b.push_back({"PRELUDE", rt::device_prelude(DTypes{DType::f32})});
    return rt::instantiate("conv_ffma", rt::template_source("conv_ffma"), b);
  }
  const DType mt = l.math == ConvMath::f16 ? DType::f16 : DType::bf16;  // the header the MMA type needs
  const std::string ty(cuda_storage_type(l.dtype));
  b.push_back({"PRELUDE", rt::device_prelude(DTypes{l.dtype, mt})});
  b.push_back({"MMA_OPS", rt::template_source("mma")});
  b.push_back({"MMA", num(static_cast<int>(l.math))});
  b.push_back({"TA", ty});
  b.push_back({"TB", ty});
  b.push_back({"TO", ty});
  return rt::instantiate("conv_igemm", rt::template_source("conv_igemm"), b);
}

void launch_igemm(const ConvLaunch& l, const ConvOperands& ops, Module m) {
  const auto& p = std::get<IgemmPlan>(l.plan);
  const int device = ops.stream->device();
  const rt::Function fn = rt::generated_function(m, m[0]->entry, device);
  rt::DeviceBuffer ws;
  if (p.splitk > 1) ws = rt::DeviceBuffer(sizeof(float) * p.splitk * p.tiles() * l.g.groups * p.bm * p.bn, *ops.stream);
  rt::LaunchConfig cfg;
  cfg.grid = {static_cast<unsigned>(p.grid_m), static_cast<unsigned>(p.grid_n),
              static_cast<unsigned>(l.g.groups * p.splitk)};
  cfg.block = {128, 1, 1};
  // The weight gradient's GEMM takes (gy, x); the pass's operands come as (x, gy).
  const bool swap = l.pass == ConvPass::grad_weight;
  rt::launch(fn, cfg, *ops.stream, swap ? ops.b : ops.a, swap ? ops.a : ops.b, ops.out, ws.ptr());
}

}  // namespace kiln::kernels::conv_kinds
