// Stride-1 convolutions from input patches in shared memory (kernel_templates/conv_patch.cu):
// picks the band of output rows and channels per block, registers the shape's kernels on first
// use, reorders the weights for them and launches.
#include <algorithm>
#include <cstdlib>
#include <climits>
#include <optional>
#include <span>
#include <string>

#include "conv_igemm.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/templates.h"
#include "backend/cuda/launch_common.h"
#include "core/registry.h"

namespace kiln::conv_detail {

using kernels::ceil_div;

namespace {

// The conv the kernel runs: for the input gradient, gy in, dx out, padding mirrored.
struct PatchConv {
  std::int64_t n, ci, h, w, co, kh, kw, oh, ow, ph, pw, dh, dw, g;
};

struct PatchPlan {
  int mma = 0, rows = 1, bn = 32;
  std::int64_t bands = 1, smem = 0;
};


std::optional<PatchConv> patch_conv(bool flip, const ConvSizes& s) {
  if (s.sh != 1 || s.sw != 1) return std::nullopt;
  if (!flip) return PatchConv{s.n, s.c, s.h, s.w, s.o, s.kh, s.kw, s.oh, s.ow, s.ph, s.pw, s.dh, s.dw, s.groups};
  const std::int64_t ph = s.dh * (s.kh - 1) - s.ph, pw = s.dw * (s.kw - 1) - s.pw;
  if (ph < 0 || pw < 0) return std::nullopt;
  return PatchConv{s.n, s.o, s.oh, s.ow, s.c, s.kh, s.kw, s.h, s.w, ph, pw, s.dh, s.dw, s.groups};
}

// The kernel's CP: a group's channels rounded up to the MMA's k step, plus the bank padding.
std::int64_t channel_run(const PatchConv& c, int mma) {
  const std::int64_t kc = mma == 2 ? 8 : 16;
  return ceil_div(c.ci / c.g, kc) * kc + (mma == 2 ? 4 : 8);
}

std::int64_t smem_bytes(const PatchConv& c, int mma, int rows, int bn) {
  const std::int64_t cp = channel_run(c, mma), el = mma == 2 ? 4 : 2;
  const std::int64_t pr = rows + (c.kh - 1) * c.dh, pwc = c.ow + (c.kw - 1) * c.dw;
  const std::int64_t mt = ceil_div(rows * c.ow, 16) * 16;
  return std::max((pr * pwc * cp + bn * c.kh * c.kw * cp) * el, bn * (mt + 4) * 4);
}

// Bands of up to 14 row tiles of 16 pixels (accumulators stay in registers), narrowed until
// the grid covers the SMs twice; none when even one row's patch overflows shared memory.
std::optional<PatchPlan> plan_patch(const PatchConv& c, int mma, int sms, int max_smem, int rows = 0) {
  PatchPlan p;
  p.mma = mma;
  const std::int64_t cog = c.co / c.g;
  p.bn = cog > 16 ? 32 : cog > 8 ? 16 : 8;
  // Weights past 64 KiB would leave room for one block per SM: take fewer channels.
  const std::int64_t wrow = c.kh * c.kw * (c.ci / c.g + (mma == 2 ? 4 : 8)) * (mma == 2 ? 4 : 2);
  while (p.bn > 8 && p.bn * wrow > 64 * 1024) p.bn /= 2;
  p.rows = static_cast<int>(std::clamp<std::int64_t>(224 / std::max<std::int64_t>(c.ow, 1), 1, c.oh));
  if (c.ow > 224) return std::nullopt;
  auto blocks = [&] { return c.n * ceil_div(c.oh, p.rows) * ceil_div(cog, p.bn) * c.g; };
  while (p.rows > 1 && (blocks() < 2 * sms || smem_bytes(c, mma, p.rows, p.bn) > max_smem)) p.rows = (p.rows + 1) / 2;
  if (rows > 0) p.rows = static_cast<int>(std::min<std::int64_t>(rows, c.oh));
  p.smem = smem_bytes(c, mma, p.rows, p.bn);
  if (p.smem > max_smem) return std::nullopt;
  p.bands = ceil_div(c.oh, p.rows);
  return p;
}

std::string source(bool flip, const PatchConv& c, const PatchPlan& p, DType t) {
  const DType mt = p.mma == 1 ? DType::f16 : DType::bf16;
  auto num = [](std::int64_t v) { return std::to_string(v); };
  const std::string ty(cuda_storage_type(t));
  const rt::Bindings b{{"MMA_OPS", rt::template_source("mma")}, {"PRELUDE", rt::device_prelude(DTypes{t, mt})},
                       {"TX", ty}, {"TW", ty}, {"TO", ty}, {"MMA", num(p.mma)}, {"FLIP", num(flip)},
                       {"N", num(c.n)}, {"CI", num(c.ci)}, {"H", num(c.h)}, {"W", num(c.w)}, {"CO", num(c.co)},
                       {"KH", num(c.kh)}, {"KW", num(c.kw)}, {"OH", num(c.oh)}, {"OW", num(c.ow)},
                       {"PH", num(c.ph)}, {"PW", num(c.pw)}, {"DH", num(c.dh)}, {"DW", num(c.dw)},
                       {"G", num(c.g)}, {"ROWS", num(p.rows)}, {"BN", num(p.bn)}};
  return rt::instantiate("conv_patch", rt::template_source("conv_patch"), b);
}

// The shape's two kernels (the conv, then the weight reorder) over one generated source.
std::span<const rt::KernelSpec* const> specs_for(bool flip, const PatchConv& c, const PatchPlan& p, DType t) {
  rt::GeneratedKey key("conv_patch");
  key.add(flip, p.mma, t, c.n, c.ci, c.h, c.w, c.co, c.kh, c.kw, c.oh, c.ow, c.ph, c.pw, c.dh, c.dw, c.g, p.rows, p.bn);
  return rt::generated_kernels(key, [&] {
    const char* mma_name = p.mma == 0 ? "bf16" : p.mma == 1 ? "f16" : "tf32";
    std::string label = std::string("conv2d ") + (flip ? "dgrad" : "fwd") + " patch " + mma_name;
    return rt::GeneratedModule{source(flip, c, p, t), std::move(label), {"kiln_conv_patch", "kiln_conv_patch_weights"}};
  });
}

bool applies(const PatchConv& c, int mma) {
  const std::int64_t cig = c.ci / c.g;
  // Channels in 8s; bf16/f16 round them up to 16 with zeros (the speedrun's 24-channel conv2).
  return mma >= 0 && cig > 0 && cig % 8 == 0 && cig <= 256;
}

}  // namespace

std::vector<int> patch_alternatives(bool flip, const ConvSizes& s, DType t, int sm_count, int max_smem) {
  const int mma = conv_mma_for(t, t, t);
  const auto c = patch_conv(flip, s);
  if (!c || !applies(*c, mma)) return {};
  const auto h = plan_patch(*c, mma, sm_count, max_smem);
  if (!h) return {};
  std::vector<int> out;
  // Half or twice the heuristic's band; a taller one holds more accumulators per block.
  for (int rows : {h->rows / 2, h->rows * 2})
    if (rows >= 1 && rows <= c->oh && rows * c->ow <= 224) {
      const auto p = plan_patch(*c, mma, sm_count, max_smem, rows);
      if (p && p->rows == rows && p->rows != h->rows) out.push_back(rows);
    }
  return out;
}

bool run_conv_patch(bool flip, const ConvSizes& s, const Tensor& a, const Tensor& b, const Tensor& out, int rows,
                    bool launch) {
  if (!generated_convs_enabled()) return false;
  const int mma = conv_mma_for(a.dtype(), b.dtype(), out.dtype());
  const auto c = patch_conv(flip, s);
  if (!c || !applies(*c, mma) || out.numel() == 0 || out.numel() >= INT_MAX / 2 || a.numel() >= INT_MAX / 2)
    return false;
  const int device = out.device().index();
  const rt::DeviceInfo& info = rt::device_info(device);
  if (info.arch() < 80) return false;
  const auto p = plan_patch(*c, mma, std::max(1, info.sm_count), std::max(48 * 1024, info.max_shared_optin), rows);
  if (!p) return false;
  if (!launch) return true;
  const auto specs = specs_for(flip, *c, *p, out.dtype());
  const rt::Function fn = rt::get_function(*specs[0], DTypes{DType::u8}, 0, device);
  const rt::Function prep = rt::get_function(*specs[1], DTypes{DType::u8}, 0, device);
  const rt::Stream& st = stream_of(out.device());
  const std::int64_t cp = channel_run(*c, mma);
  Tensor wt = empty({c->co * c->kh * c->kw * cp}, {.dtype = mma == 2 ? DType::f32 : mma == 1 ? DType::f16 : DType::bf16,
                                                    .device = out.device()});
  rt::launch(prep, kernels::grid_stride_config(static_cast<std::uint64_t>(wt.numel()), device), st, device_address(b),
             device_address(wt));
  rt::LaunchConfig cfg;
  cfg.grid = {static_cast<unsigned>(c->n * p->bands), static_cast<unsigned>(ceil_div(c->co / c->g, p->bn)),
              static_cast<unsigned>(c->g)};
  cfg.block = {128, 1, 1};
  cfg.shared_bytes = static_cast<unsigned>(p->smem);
  rt::launch(fn, cfg, st, device_address(a), device_address(wt), device_address(out));
  return true;
}

std::string conv_patch_source(bool flip, const ConvSizes& s, DType t, int sm_count, int rows) {
  const int mma = conv_mma_for(t, t, t);
  const auto c = patch_conv(flip, s);
  if (!c || !applies(*c, mma)) return {};
  const auto p = plan_patch(*c, mma, sm_count, 227 * 1024, rows);
  return p ? source(flip, *c, *p, t) : std::string();
}

}  // namespace kiln::conv_detail
