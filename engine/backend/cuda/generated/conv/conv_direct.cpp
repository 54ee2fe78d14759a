// The direct kind: a stride-1 forward or input gradient over few channels on the CUDA cores.
// Picks each thread's channels and pixels and each block's band of rows, builds the shape's
// source and launches it.
#include <algorithm>
#include <climits>

#include "backend/cuda/launch_common.h"
#include "conv_kinds.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/templates.h"

namespace kiln::kernels::conv_kinds {

namespace {

constexpr std::int64_t kMaxThreads = 256;

constexpr std::int64_t kMmaThreads = 256;

// The k steps of 16 taps and the tiles of 8 channels of the tensor-core kernel's GEMM.
std::int64_t mma_k_steps(const PatchConv& c) { return ceil_div(c.ci * c.kh * c.kw, 16); }
std::int64_t mma_n_tiles(const PatchConv& c) { return ceil_div(c.co, 8); }

// The weights and the band, then with totals each thread's sums and squares of ot channels. On
// tensor cores, in 16 bits: the band and a plane of zeros, the weights' tiles and each warp's
// run of outputs; then with totals the warps' sums.
std::int64_t direct_smem_bytes(const PatchConv& c, const DirectPlan& p) {
  if (p.mma) {
    const std::int64_t wop = ceil_div(c.ow, 16) * 16, channels = mma_n_tiles(c) * 8, warps = kMmaThreads / 32;
    const std::int64_t band = ceil_div((c.ci + 1) * (p.rows + c.kh - 1) * (wop + c.kw - 1) * 2, 16) * 16;
    const std::int64_t tiles = (channels * mma_k_steps(c) * 16 + warps * channels * 16) * 2;
    return band + tiles + (p.totals ? warps * 2 * channels * 4 : 0);
  }
  const std::int64_t cop = ceil_div(c.co, p.ot) * p.ot, sw = ceil_div(c.ow, p.p) * p.p + c.kw - 1;
  const std::int64_t sums = p.totals ? 2 * p.ot * static_cast<std::int64_t>(p.threads) : 0;
  return (c.ci * c.kh * c.kw * cop + c.ci * (p.rows + c.kh - 1) * sw + sums) * static_cast<std::int64_t>(sizeof(float));
}

}  // namespace

// Where a tensor-core tile would sit mostly empty: at most 64 products per output (a first
// conv's few input channels) or at most 4 output channels (the input gradient of a first conv);
// for exact f32, whose tensor-core path sums three products, up to 256 products per output.
// Windows up to 8x8 (the thread's input window stays in registers), no dilation or groups.
// Up to 8 channels and 4 pixels a thread (8 pixels where it sums 1 or 2 channels), in bands of
// rows that fill 256 threads, balanced so the last band is not left short.
std::optional<DirectPlan> plan_direct(ConvPass pass, const ConvGeometry& g, ConvMath math, const ConvTarget& target) {
  const auto c = as_forward(pass, g);
  if (!c || c->dh != 1 || c->dw != 1 || c->g != 1 || c->kh > 8 || c->kw > 8 || c->n == 0 || c->oh == 0 ||
      c->ow == 0 || c->co == 0)
    return std::nullopt;
  const std::int64_t products = c->ci * c->kh * c->kw;
  if (products > (math == ConvMath::f32 ? 256 : 64) && c->co > 4) return std::nullopt;
  DirectPlan p;
  p.conv = *c;
  // 16-bit operands on tensor cores where the weights' fragments fit a thread's registers (at
  // most 16 tiles of 16 taps x 8 channels), in bands of rows that make about a block an SM. On the
  // H200 the speedrun's conv1 with its batch norm's statistics took 15.5 us against 16.4-17.0 on
  // the CUDA cores (ncu), and the speedrun 0.0318 s against 0.0327 (5 seeds, one call); alone, its
  // forward took 7.95 us against 6.96 (bench_conv), whose stores are wider.
  p.mma = (math == ConvMath::bf16 || math == ConvMath::f16) && mma_k_steps(*c) * mma_n_tiles(*c) <= 16;
  if (p.mma) {
    p.bands = std::clamp<std::int64_t>(ceil_div(std::max(1, target.sm_count), c->n), 1, c->oh);
    p.rows = static_cast<int>(ceil_div(c->oh, p.bands));
    p.bands = ceil_div(c->oh, p.rows);
    p.threads = static_cast<int>(kMmaThreads);
    p.ot = p.p = 0;
    p.smem = direct_smem_bytes(*c, p);
    if (p.smem > target.max_shared || c->n * p.bands > INT_MAX) return std::nullopt;
    return p;
  }
  p.ot = static_cast<int>(std::min<std::int64_t>(c->co, 8));
  p.p = p.ot <= 2 ? 8 : 4;
  const std::int64_t per_row = ceil_div(c->ow, p.p) * ceil_div(c->co, p.ot);
  if (per_row > kMaxThreads) return std::nullopt;
  const std::int64_t rows = std::clamp<std::int64_t>(kMaxThreads / per_row, 1, c->oh);
  p.bands = ceil_div(c->oh, rows);
  p.rows = static_cast<int>(ceil_div(c->oh, p.bands));
  p.threads = static_cast<int>(ceil_div(per_row * p.rows, 32) * 32);
  p.smem = direct_smem_bytes(*c, p);
  if (p.smem > target.max_shared || c->n * p.bands > INT_MAX) return std::nullopt;
  return p;
}

std::optional<ConvLaunch> direct_with_totals(ConvLaunch l, const ConvTarget& target) {
  auto& p = std::get<DirectPlan>(l.plan);
  if (l.pass != ConvPass::forward || p.conv.n * p.bands > kMaxStatsBlocks) return std::nullopt;
  p.totals = true;
  p.smem = direct_smem_bytes(p.conv, p);
  if (p.smem > target.max_shared) return std::nullopt;
  return l;
}

std::int64_t direct_stats_floats(const ConvLaunch& l) {
  const auto& p = std::get<DirectPlan>(l.plan);
  return p.totals ? stats_floats_of(p.conv.n * p.bands, p.conv.co) : 0;
}

std::string direct_source(const ConvLaunch& l) {
  const auto& p = std::get<DirectPlan>(l.plan);
  const PatchConv& c = p.conv;
  rt::Bindings b{{"PRELUDE", rt::device_prelude(DTypes{l.dtype})},
                 {"CONV_STATS", rt::template_source("conv_stats")},
                 {"T", std::string(cuda_storage_type(l.dtype))},
                 {"FLIP", l.pass == ConvPass::grad_input ? "true" : "false"},
                 {"STATS", p.totals ? "true" : "false"},
                 {"CI", num(c.ci)},
                 {"HI", num(c.h)},
                 {"WI", num(c.w)},
                 {"CO", num(c.co)},
                 {"HO", num(c.oh)},
                 {"WO", num(c.ow)},
                 {"KH", num(c.kh)},
                 {"KW", num(c.kw)},
                 {"PH", num(c.ph)},
                 {"PW", num(c.pw)},
                 {"ROWS", num(p.rows)}};
  if (p.mma) {
    b.push_back({"MMA_OPS", rt::template_source("mma")});
    b.push_back({"MMA", num(static_cast<int>(l.math))});
    return rt::instantiate("conv_direct_mma", rt::template_source("conv_direct_mma"), b);
  }
  b.push_back({"OT", num(p.ot)});
  b.push_back({"P", num(p.p)});
  b.push_back({"THREADS", num(p.threads)});
  return rt::instantiate("conv_direct", rt::template_source("conv_direct"), b);
}

void launch_direct(const ConvLaunch& l, const ConvOperands& ops, Module m) {
  const auto& p = std::get<DirectPlan>(l.plan);
  const rt::Stream& st = *ops.stream;
  const rt::Function fn = rt::generated_function(m, "kiln_conv_direct", st.device());
  rt::LaunchConfig cfg;
  cfg.grid = {static_cast<unsigned>(p.conv.n * p.bands), 1, 1};
  cfg.block = {static_cast<unsigned>(p.threads), 1, 1};
  cfg.shared_bytes = static_cast<unsigned>(p.smem);
  const rt::DevicePtr stats = p.totals ? ops.stats : 0;
  if (p.totals && stats == 0) throw Error("[conv2d] a direct conv taking statistics was launched without their buffer");
  rt::launch(fn, cfg, st, ops.a, ops.b, ops.out, stats);
}

}  // namespace kiln::kernels::conv_kinds
