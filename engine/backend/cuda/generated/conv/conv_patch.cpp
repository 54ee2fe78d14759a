// The patch kind: stride-1 forward and input gradient from input patches staged in shared
// memory. Picks the band of output rows and channels per block, builds the shape's source and
// launches it. Its blocks stage their weights from w themselves; a forward also writes its input
// gradient's reordered weights where that gradient runs the patch kind too (conv_kept.h), and
// that gradient's blocks copy them.
#include <algorithm>
#include <climits>
#include <memory>

#include "backend/cuda/launch_common.h"
#include "conv_kept.h"
#include "conv_kinds.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/templates.h"

namespace kiln::kernels::conv_kinds {

namespace {

// The kernel's CP: a group's channels rounded up to the MMA's k step, plus the bank padding.
std::int64_t channel_run(const PatchConv& c, ConvMath math) {
  const std::int64_t kc = math == ConvMath::tf32 ? 8 : 16;
  return ceil_div(c.ci / c.g, kc) * kc + (math == ConvMath::tf32 ? 4 : 8);
}

std::int64_t smem_bytes(const PatchConv& c, ConvMath math, int rows, int bn) {
  const std::int64_t cp = channel_run(c, math), el = math == ConvMath::tf32 ? 4 : 2;
  const std::int64_t pr = rows + (c.kh - 1) * c.dh, pwc = c.ow + (c.kw - 1) * c.dw;
  const std::int64_t mt = ceil_div(rows * c.ow, 16) * 16;
  return std::max((pr * pwc * cp + bn * c.kh * c.kw * cp) * el, bn * (mt + 4) * 4);
}

}  // namespace

// Bands of up to 14 row tiles of 16 pixels (accumulators stay in registers), narrowed until
// the grid covers the SMs twice; none when even one row's patch overflows shared memory.
// Channels in 8s; bf16/f16 round them up to 16 with zeros (the speedrun's 24-channel conv2).
std::optional<PatchPlan> plan_patch(ConvPass pass, const ConvGeometry& g, ConvMath math, const ConvTarget& target,
                                    int rows) {
  const auto c = as_forward(pass, g);
  if (!c || !tensor_cores(math)) return std::nullopt;
  const std::int64_t cig = c->ci / c->g, cog = c->co / c->g, sms = std::max(1, target.sm_count);
  if (cig <= 0 || cig % 8 != 0 || cig > 256 || c->ow > 224 || c->oh == 0 || c->ow == 0 || cog == 0 || c->n == 0)
    return std::nullopt;
  PatchPlan p;
  p.conv = *c;
  p.bn = cog > 16 ? 32 : cog > 8 ? 16 : 8;
  // Weights past 64 KiB would leave room for one block per SM: take fewer channels.
  const bool tf32 = math == ConvMath::tf32;
  const std::int64_t wrow = c->kh * c->kw * (cig + (tf32 ? 4 : 8)) * (tf32 ? 4 : 2);
  while (p.bn > 8 && p.bn * wrow > 64 * 1024) p.bn /= 2;
  p.rows = static_cast<int>(std::clamp<std::int64_t>(224 / c->ow, 1, c->oh));
  auto blocks = [&] { return c->n * ceil_div(c->oh, p.rows) * ceil_div(cog, p.bn) * c->g; };
  while (p.rows > 1 && (blocks() < 2 * sms || smem_bytes(*c, math, p.rows, p.bn) > target.max_shared))
    p.rows = (p.rows + 1) / 2;
  if (rows > 0) p.rows = static_cast<int>(std::min<std::int64_t>(rows, c->oh));
  p.smem = smem_bytes(*c, math, p.rows, p.bn);
  if (p.smem > target.max_shared) return std::nullopt;
  p.bands = ceil_div(c->oh, p.rows);
  p.channel_run = channel_run(*c, math);
  if (pass == ConvPass::forward)
    if (const auto flipped = plan_patch(ConvPass::grad_input, g, math, target, 0)) p.flipped_run = flipped->channel_run;
  return p;
}

std::vector<ConvTile> patch_alternatives(const ConvLaunch& l, const ConvTarget& target) {
  const auto& h = std::get<PatchPlan>(l.plan);
  std::vector<ConvTile> out;
  // Half or twice the heuristic's band; a taller one holds more accumulators per block.
  for (int rows : {h.rows / 2, h.rows * 2})
    if (rows >= 1 && rows <= h.conv.oh && rows * h.conv.ow <= 224) {
      const auto p = plan_patch(l.pass, l.g, l.math, target, rows);
      if (p && p->rows == rows && p->rows != h.rows) out.push_back(ConvTile{.rows = rows});
    }
  return out;
}

// A forward of one group whose blocks each take every output channel: a row of partials a block.
std::optional<ConvLaunch> patch_with_totals(ConvLaunch l) {
  auto& p = std::get<PatchPlan>(l.plan);
  const PatchConv& c = p.conv;
  if (l.pass != ConvPass::forward || c.g != 1 || p.bn < c.co || c.n * p.bands > kMaxStatsBlocks) return std::nullopt;
  p.totals = true;
  return l;
}

std::int64_t patch_stats_floats(const ConvLaunch& l) {
  const auto& p = std::get<PatchPlan>(l.plan);
  return p.totals ? stats_floats_of(p.conv.n * p.bands, p.conv.co) : 0;
}

// An input gradient of one group whose output the batch norm's 2 x 2 windows pool exactly (x's
// rows and columns past twice the gradient's are in no window; x's rows of even width): a split
// per block along x. The band's windows of x are staged after the kernel's shared memory.
std::optional<ConvLaunch> patch_with_pool_sums(ConvLaunch l, const ConvPoolSums& s, const ConvTarget& target) {
  auto& p = std::get<PatchPlan>(l.plan);
  const PatchConv& c = p.conv;
  const std::int64_t smem =
      ceil_div(p.smem, 16) * 16 + p.bn * 2 * p.rows * 2 * c.ow * static_cast<std::int64_t>(dtype_size(l.dtype));
  if (l.pass != ConvPass::grad_input || c.g != 1 || s.h / 2 != c.oh || s.w / 2 != c.ow || s.w % 2 != 0 ||
      c.n * p.bands > INT_MAX || smem > target.max_shared)
    return std::nullopt;
  p.smem = smem;
  p.pool_sums = true;
  // 16 bytes a copy where the staged rows (2 * ow values) and x's rows start 16-byte aligned (the
  // speedrun's: 27 copies of 4 bytes a thread took its input gradient to 22.4 us).
  const std::int64_t size = static_cast<std::int64_t>(dtype_size(l.dtype));
  p.pool_copy = (2 * c.ow * size) % 16 == 0 && (s.w * size) % 16 == 0 && s.x % 16 == 0 ? 16 : 2 * size;
  p.pool_p = s.p, p.pool_h = s.h, p.pool_w = s.w;
  return l;
}

std::int64_t patch_parked_splits(const ConvLaunch& l) {
  const auto& p = std::get<PatchPlan>(l.plan);
  return p.totals || p.pool_sums ? p.conv.n * p.bands : 0;
}

std::string patch_source(const ConvLaunch& l) {
  const auto& p = std::get<PatchPlan>(l.plan);
  const PatchConv& c = p.conv;
  const DType mt = l.math == ConvMath::f16 ? DType::f16 : DType::bf16;
  const std::string ty(cuda_storage_type(l.dtype));
  const rt::Bindings b{{"MMA_OPS", rt::template_source("mma")},
                       {"CONV_STATS", rt::template_source("conv_stats")},
                       {"BN_POOL_WINDOW", rt::template_source("bn_pool_window")},
                       {"PRELUDE", rt::device_prelude(DTypes{l.dtype, mt, p.pool_p})},
                       {"STATS", p.totals ? "true" : "false"},
                       {"POOL_SUMS", p.pool_sums ? "true" : "false"},
                       {"TP", std::string(cuda_storage_type(p.pool_p))},
                       {"XH", num(p.pool_h)},
                       {"XW", num(p.pool_w)},
                       {"XV", num(p.pool_sums ? p.pool_copy : 4)},
                       {"TX", ty},
                       {"TW", ty},
                       {"TO", ty},
                       {"MMA", num(static_cast<int>(l.math))},
                       {"FLIP", num(l.pass == ConvPass::grad_input)},
                       {"N", num(c.n)},
                       {"CI", num(c.ci)},
                       {"H", num(c.h)},
                       {"W", num(c.w)},
                       {"CO", num(c.co)},
                       {"KH", num(c.kh)},
                       {"KW", num(c.kw)},
                       {"OH", num(c.oh)},
                       {"OW", num(c.ow)},
                       {"PH", num(c.ph)},
                       {"PW", num(c.pw)},
                       {"DH", num(c.dh)},
                       {"DW", num(c.dw)},
                       {"G", num(c.g)},
                       {"ROWS", num(p.rows)},
                       {"BN", num(p.bn)}};
  return rt::instantiate("conv_patch", rt::template_source("conv_patch"), b);
}

namespace {

// Under a ConvForBackward of the weights: a forward's buffer for the flipped copy its input
// gradient's patch conv reads (its blocks write it), kept for that gradient, which takes it.
struct FlippedWeights {
  std::shared_ptr<const rt::DeviceBuffer> read;  // an input gradient's, taken
  std::shared_ptr<rt::DeviceBuffer> write;       // a forward's, kept
};

FlippedWeights flipped_weights(const ConvLaunch& l, const ConvOperands& ops) {
  const auto& p = std::get<PatchPlan>(l.plan);
  const PatchConv& c = p.conv;
  const rt::Stream& st = *ops.stream;
  const DType mt = l.math == ConvMath::tf32 ? DType::f32 : l.math == ConvMath::f16 ? DType::f16 : DType::bf16;
  const kept::OperandScope* scope = kept::weights_scope(ops.b);
  if (!scope) return {};
  // The input gradient's copy: its channel run, taps and channels (the forward's input channels).
  auto key = [&](std::int64_t run, std::int64_t channels) {
    return kept::KeptCopy{
        ops.b, run, c.kh * c.kw, channels, mt, 1, st.handle(), nullptr, kept::CopyOf::patch_flipped_weights};
  };
  if (l.pass == ConvPass::grad_input) return {kept::take_for_backward(key(p.channel_run, c.co), *scope), nullptr};
  if (p.flipped_run == 0) return {};
  auto out = std::make_shared<rt::DeviceBuffer>(
      static_cast<std::size_t>(c.ci * c.kh * c.kw * p.flipped_run) * dtype_size(mt), st);
  kept::KeptCopy k = key(p.flipped_run, c.ci);
  k.copy = out;
  kept::keep_for_backward(k, *scope);
  return {nullptr, std::move(out)};
}

}  // namespace

void launch_patch(const ConvLaunch& l, const ConvOperands& ops, Module m) {
  const auto& p = std::get<PatchPlan>(l.plan);
  const PatchConv& c = p.conv;
  const rt::Stream& st = *ops.stream;
  const rt::Function fn = rt::generated_function(m, "kiln_conv_patch", st.device());
  const FlippedWeights flipped = flipped_weights(l, ops);
  rt::LaunchConfig cfg;
  cfg.grid = {static_cast<unsigned>(c.n * p.bands), static_cast<unsigned>(ceil_div(c.co / c.g, p.bn)),
              static_cast<unsigned>(c.g)};
  cfg.block = {128, 1, 1};
  cfg.shared_bytes = static_cast<unsigned>(p.smem);
  const rt::DevicePtr stats = p.totals ? ops.stats : 0;
  if (p.totals && stats == 0) throw Error("[conv2d] a patch conv taking statistics was launched without their buffer");
  // conv_patch.cu's PoolSums, field for field.
  struct {
    rt::DevicePtr x = 0, weight = 0, bias = 0, mean = 0, invstd = 0, parts = 0;
    std::int32_t relu = 0;
  } pool;
  if (p.pool_sums) {
    const ConvPoolSums* s = ops.pool_sums;
    if (!s || s->parts == 0)
      throw Error("[conv2d] a patch conv parking a pooled batch norm's sums was launched without their buffer");
    pool = {s->x, s->weight, s->bias, s->mean, s->invstd, s->parts, s->relu ? 1 : 0};
  }
  rt::launch(fn, cfg, st, ops.a, ops.b, flipped.read ? flipped.read->ptr() : rt::DevicePtr{0},
             flipped.write ? flipped.write->ptr() : rt::DevicePtr{0}, ops.out, stats, pool);
}

}  // namespace kiln::kernels::conv_kinds
