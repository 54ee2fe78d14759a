// Chooses tiles and split-K for one convolution pass, registers its kernel (the template
// instantiated with the shape as constants) on first use, and launches it.
#include "conv_igemm.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <string>

#include "kiln/conv.h"
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

struct IgemmPlan {
  int mma = 0;  // 0 bf16, 1 f16, 2 tf32
  std::int64_t gm = 0, gn = 0, gk = 0;
  int bm = 0, bn = 0, bk = 0, splitk = 1;
  std::int64_t grid_m = 0, grid_n = 0;
  std::int64_t tiles() const { return grid_m * grid_n; }
};


constexpr std::int64_t kFfmaChain = 4096;

// Tiles large enough to feed the tensor cores, small enough to fill the SMs; k split across
// blocks when the output alone leaves most SMs idle (weight gradients).
IgemmPlan plan_for(ConvPass pass, const ConvSizes& s, int mma, int sms, ConvTiles tiles_ = {}) {
  IgemmPlan p;
  p.mma = mma;
  const std::int64_t cg = s.c / s.groups, og = s.o / s.groups, rs = s.kh * s.kw;
  if (pass == ConvPass::forward) p.gm = s.n * s.oh * s.ow, p.gn = og, p.gk = cg * rs;
  if (pass == ConvPass::grad_input) p.gm = s.n * s.h * s.w, p.gn = cg, p.gk = og * rs;
  if (pass == ConvPass::grad_weight) p.gm = og, p.gn = cg * rs, p.gk = s.n * s.oh * s.ow;
  p.bk = mma == 2 ? 16 : mma == kFfma ? 8 : 32;
  p.bn = p.gn <= 16 ? 16 : p.gn <= 32 ? 32 : 64;
  p.bm = p.gm <= 32 ? 32 : p.gm <= 64 ? 64 : 128;
  auto tiles = [&] { return ceil_div(p.gm, p.bm) * ceil_div(p.gn, p.bn) * s.groups; };
  if (p.bm == 128 && tiles() < 2 * sms) p.bm = 64;
  if (tiles_.bm > 0) p.bm = tiles_.bm, p.bn = tiles_.bn;
  p.grid_m = ceil_div(p.gm, p.bm);
  p.grid_n = ceil_div(p.gn, p.bn);
  const std::int64_t kt = ceil_div(p.gk, p.bk);
  std::int64_t want = 1;
  if (tiles() < sms && kt >= 8) want = std::min<std::int64_t>({ceil_div(2 * sms, tiles()), kt / 4, 64});
  // Exact f32 sums each split in one running f32 sum: at most kFfmaChain terms, so a long weight
  // gradient (300 images of 64x64: 1.2M terms) rounds no worse than cuBLAS's.
  if (mma == kFfma) want = std::max(want, std::min<std::int64_t>(ceil_div(p.gk, kFfmaChain), 4096));
  want = std::min<std::int64_t>(want, 65535 / s.groups);  // grid.z holds groups * splits
  if (want > 1) {
    const std::int64_t per = ceil_div(kt, want);
    p.splitk = static_cast<int>(ceil_div(kt, per));  // no empty splits: each one counts in
  }
  return p;
}

// Narrow products where im2col + cuBLAS measured faster on the H100 than an FFMA tile at least
// 16 wide: a one-channel conv's input gradient (n = 1: 250 vs 36 us for the cnn's conv1) and
// weight gradients of fewer than 32 columns (conv1's 25: 101 vs 92 us).
bool ffma_declines(ConvPass pass, const IgemmPlan& p) {
  return p.gn < 16 || (pass == ConvPass::grad_weight && p.gn < 32);
}

const char* pass_name(ConvPass p) {
  return p == ConvPass::forward ? "fwd" : p == ConvPass::grad_input ? "dgrad" : "wgrad";
}

const char* mma_name(int mma) { return mma == 0 ? "bf16" : mma == 1 ? "f16" : mma == 2 ? "tf32" : "f32"; }

std::string source(ConvPass pass, const ConvSizes& s, const IgemmPlan& p, DType ta, DType tb, DType to) {
  auto num = [](std::int64_t v) { return std::to_string(v); };
  rt::Bindings b{{"CONV_COMMON", rt::template_source("conv_common")},
                 {"MODE", num(static_cast<int>(pass))},
                 {"N", num(s.n)}, {"C", num(s.c)}, {"H", num(s.h)}, {"W", num(s.w)}, {"O", num(s.o)},
                 {"KH", num(s.kh)}, {"KW", num(s.kw)}, {"OH", num(s.oh)}, {"OW", num(s.ow)},
                 {"SH", num(s.sh)}, {"SW", num(s.sw)}, {"PH", num(s.ph)}, {"PW", num(s.pw)},
                 {"DH", num(s.dh)}, {"DW", num(s.dw)}, {"G", num(s.groups)}, {"BM", num(p.bm)},
                 {"BN", num(p.bn)}, {"SPLITK", num(p.splitk)},
                 {"TILES", num(p.tiles() * s.groups)}};
  if (p.mma == kFfma) {
    b.push_back({"PRELUDE", rt::device_prelude(DTypes{DType::f32})});
    return rt::instantiate("conv_ffma", rt::template_source("conv_ffma"), b);
  }
  const DType mt = p.mma == 1 ? DType::f16 : DType::bf16;  // the header the MMA type needs
  b.push_back({"PRELUDE", rt::device_prelude(DTypes{ta, tb, to, mt})});
  b.push_back({"MMA_OPS", rt::template_source("mma")});
  b.push_back({"MMA", num(p.mma)});
  b.push_back({"TA", std::string(cuda_storage_type(ta))});
  b.push_back({"TB", std::string(cuda_storage_type(tb))});
  b.push_back({"TO", std::string(cuda_storage_type(to))});
  return rt::instantiate("conv_igemm", rt::template_source("conv_igemm"), b);
}

// One generated kernel per (pass, dtypes, sizes, plan); its source is made on the first call.
const rt::KernelSpec& spec_for(ConvPass pass, const ConvSizes& s, const IgemmPlan& p, DType ta, DType tb, DType to) {
  rt::GeneratedKey key("conv_igemm");
  key.add(pass, p.mma, ta, tb, to, p.bm, p.bn, p.splitk);
  add_sizes(key, s);
  return *rt::generated_kernels(key, [&] {
    return rt::GeneratedModule{source(pass, s, p, ta, tb, to),
                               std::string("conv2d ") + pass_name(pass) + " " + mma_name(p.mma),
                               {p.mma == kFfma ? "kiln_conv_ffma" : "kiln_conv_igemm"}};
  })[0];
}

}  // namespace

void add_sizes(rt::GeneratedKey& key, const ConvSizes& s) {
  key.add(s.n, s.c, s.h, s.w, s.o, s.kh, s.kw, s.oh, s.ow, s.sh, s.sw, s.ph, s.pw, s.dh, s.dw, s.groups);
}

bool generated_convs_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("KILN_CONV_IGEMM");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

const rt::DeviceInfo* generated_conv_device(std::initializer_list<const Tensor*> tensors) {
  if (!generated_convs_enabled() || tensors.size() == 0) return nullptr;
  for (const Tensor* t : tensors)
    if (t->numel() >= INT_MAX / 2) return nullptr;  // the kernels index in 32 bits
  const rt::DeviceInfo& info = rt::device_info((*tensors.begin())->device().index());
  return info.arch() >= 80 ? &info : nullptr;
}

int igemm_kind_for(DType ta, DType tb, DType to) {
  const int mma = conv_mma_for(ta, tb, to);
  if (mma >= 0) return mma;
  return ta == DType::f32 && tb == DType::f32 && to == DType::f32 ? kFfma : -1;
}

int conv_mma_for(DType ta, DType tb, DType to) {
  if (ta != tb || ta != to) return -1;
  if (ta == DType::bf16) return 0;
  if (ta == DType::f16) return 1;
  if (ta == DType::f32 && allow_conv_tf32()) return 2;
  return -1;
}

std::vector<ConvTiles> igemm_alternatives(ConvPass pass, const ConvSizes& s, DType t, int sm_count) {
  const int mma = igemm_kind_for(t, t, t);
  if (mma < 0) return {};
  const IgemmPlan h = plan_for(pass, s, mma, sm_count);
  std::vector<ConvTiles> out;
  // Neighbours of the heuristic's tile: half or twice as tall, half or twice as wide.
  for (ConvTiles c : {ConvTiles{h.bm / 2, h.bn}, ConvTiles{h.bm * 2, h.bn}, ConvTiles{h.bm, h.bn / 2},
                      ConvTiles{h.bm, h.bn * 2}})
    if (c.bm >= 32 && c.bm <= 128 && c.bn >= 16 && c.bn <= 64 && c.bm < 2 * h.gm && c.bn < 2 * h.gn) out.push_back(c);
  return out;
}

bool run_conv_igemm(ConvPass pass, const ConvSizes& s, const Tensor& a, const Tensor& b, const Tensor& out,
                    ConvTiles tiles, bool launch) {
  const int mma = igemm_kind_for(a.dtype(), b.dtype(), out.dtype());
  if (mma < 0 || out.numel() == 0) return false;
  const rt::DeviceInfo* info = generated_conv_device({&out, &a, &b});
  if (!info) return false;
  const int device = out.device().index();
  const IgemmPlan p = plan_for(pass, s, mma, std::max(1, info->sm_count), tiles);
  if (p.gk == 0) return false;  // an empty sum: the fallback writes the zeros
  if (mma == kFfma && ffma_declines(pass, p)) return false;
  if (!launch) return true;
  const rt::KernelSpec& spec = spec_for(pass, s, p, a.dtype(), b.dtype(), out.dtype());
  const rt::Function fn = rt::get_function(spec, DTypes{DType::u8}, 0, device);
  Tensor ws;
  rt::DevicePtr wp = 0;
  if (p.splitk > 1) {
    ws = empty({p.splitk * p.tiles() * s.groups * p.bm * p.bn}, {.dtype = DType::f32, .device = out.device()});
    wp = device_address(ws);
  }
  rt::LaunchConfig cfg;
  cfg.grid = {static_cast<unsigned>(p.grid_m), static_cast<unsigned>(p.grid_n),
              static_cast<unsigned>(s.groups * p.splitk)};
  cfg.block = {128, 1, 1};
  rt::launch(fn, cfg, stream_of(out.device()), device_address(a), device_address(b), device_address(out), wp);
  return true;
}

std::string conv_igemm_source(ConvPass pass, const ConvSizes& s, DType t, int sm_count, ConvTiles tiles) {
  const int mma = igemm_kind_for(t, t, t);
  if (mma < 0) return {};
  return source(pass, s, plan_for(pass, s, mma, sm_count, tiles), t, t, t);
}

}  // namespace kiln::conv_detail
