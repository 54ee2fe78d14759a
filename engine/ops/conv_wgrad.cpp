// Stride-1 weight gradients from staged gy and input rows (kernel_templates/conv_wgrad.cu):
// picks the channel tile and how many images a block sums, registers the shape's kernels on
// first use, and launches them with their f32 workspace of per-group sums.
#include <algorithm>
#include <climits>
#include <string>

#include "conv_igemm.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/templates.h"
#include "backend/cuda/launch_common.h"
#include "core/registry.h"

namespace kiln::conv_detail {

using kernels::ceil_div;

namespace {

struct WgradPlan {
  int mma = 0, bc = 32;
  std::int64_t ipb = 1, groups_of_images = 1, o_tiles = 1, c_tiles = 1, smem = 0;
};


bool wgrad_applies(const ConvSizes& s, int mma) {
  const std::int64_t cg = s.c / s.groups;
  // Channels in 8s: with one channel (the MNIST cnn's conv1: 121 us against the implicit
  // GEMM's 80 in bf16 on the H100) most of the staged rows would be zeros.
  return mma >= 0 && s.sh == 1 && s.sw == 1 && cg > 0 && cg % 8 == 0 && s.oh * s.ow > 0 && s.kw <= 8;
}

// Shared memory of the kernel's gy rows and staged input rows (mirrors conv_wgrad.cu).
std::int64_t smem_bytes(const ConvSizes& s, int mma, int bc) {
  const std::int64_t ohw = s.oh * s.ow, el = mma == 2 ? 4 : 2;
  const std::int64_t kp = mma == 2 ? (ceil_div(ohw, 8) * 8 + 27) / 32 * 32 + 4 : ceil_div(ohw, 16) * 16 + 8;
  const std::int64_t pwc = s.ow + (s.kw - 1) * s.dw, cp = bc + 8;
  return (64 * kp + (s.oh * pwc + 1) * cp) * el;
}

// About four blocks per SM, so one block's staging overlaps another's products (at one per SM
// the speedrun's conv2 took 113 us, mostly waiting on loads); more groups only add to the reduce.
WgradPlan plan_for(const ConvSizes& s, int mma, int sms) {
  WgradPlan p;
  p.mma = mma;
  const std::int64_t cg = s.c / s.groups, og = s.o / s.groups;
  p.bc = static_cast<int>(std::min<std::int64_t>(32, cg));  // 8, 16, 24 or 32 channels
  p.o_tiles = ceil_div(og, 64);
  p.c_tiles = ceil_div(cg, p.bc);
  const std::int64_t per_group = s.kh * p.o_tiles * p.c_tiles * s.groups;
  const std::int64_t want = std::max<std::int64_t>(1, ceil_div(4 * sms, per_group));
  p.ipb = ceil_div(s.n, std::min(want, s.n));
  p.groups_of_images = ceil_div(s.n, p.ipb);
  p.smem = smem_bytes(s, mma, p.bc);
  return p;
}

std::string source(const ConvSizes& s, const WgradPlan& p, DType t) {
  const DType mt = p.mma == 1 ? DType::f16 : DType::bf16;
  auto num = [](std::int64_t v) { return std::to_string(v); };
  const std::string ty(cuda_storage_type(t));
  const rt::Bindings b{{"MMA_OPS", rt::template_source("mma")}, {"PRELUDE", rt::device_prelude(DTypes{t, mt})},
                       {"TX", ty}, {"TO", ty}, {"MMA", num(p.mma)},
                       {"N", num(s.n)}, {"C", num(s.c)}, {"H", num(s.h)}, {"W", num(s.w)}, {"O", num(s.o)},
                       {"KH", num(s.kh)}, {"KW", num(s.kw)}, {"OH", num(s.oh)}, {"OW", num(s.ow)},
                       {"PH", num(s.ph)}, {"PW", num(s.pw)}, {"DH", num(s.dh)}, {"DW", num(s.dw)},
                       {"G", num(s.groups)}, {"BC", num(p.bc)}, {"IPB", num(p.ipb)}};
  return rt::instantiate("conv_wgrad", rt::template_source("conv_wgrad"), b);
}

}  // namespace

bool run_conv_wgrad(const ConvSizes& s, const Tensor& x, const Tensor& gy, const Tensor& dw, bool launch) {
  const int mma = conv_mma_for(x.dtype(), gy.dtype(), dw.dtype());
  if (!wgrad_applies(s, mma) || dw.numel() == 0 || s.n == 0) return false;
  const rt::DeviceInfo* info = generated_conv_device({&dw, &x, &gy});
  if (!info) return false;
  const int device = dw.device().index();
  const WgradPlan p = plan_for(s, mma, std::max(1, info->sm_count));
  if (p.smem > std::max(48 * 1024, info->max_shared_optin)) return false;
  if (!launch) return true;
  rt::GeneratedKey key("conv_wgrad");
  key.add(p.mma, dw.dtype(), p.bc, p.ipb);
  add_sizes(key, s);
  const auto specs = rt::generated_kernels(key, [&] {
    const char* mma_name = p.mma == 0 ? "bf16" : p.mma == 1 ? "f16" : "tf32";
    return rt::GeneratedModule{source(s, p, dw.dtype()), std::string("conv2d wgrad ") + mma_name,
                               {"kiln_conv_wgrad", "kiln_conv_wgrad_reduce"}};
  });
  const rt::Function fn = rt::get_function(*specs[0], DTypes{DType::u8}, 0, device);
  const rt::Function reduce = rt::get_function(*specs[1], DTypes{DType::u8}, 0, device);
  const Tensor ws = empty({p.groups_of_images * dw.numel()}, {.dtype = DType::f32, .device = dw.device()});
  const rt::Stream& st = stream_of(dw.device());
  rt::LaunchConfig cfg;
  cfg.grid = {static_cast<unsigned>(s.kh), static_cast<unsigned>(p.o_tiles * p.c_tiles),
              static_cast<unsigned>(s.groups * p.groups_of_images)};
  cfg.block = {128, 1, 1};
  cfg.shared_bytes = static_cast<unsigned>(p.smem);
  rt::launch(fn, cfg, st, device_address(x), device_address(gy), device_address(ws));
  rt::launch(reduce, kernels::grid_stride_config(static_cast<std::uint64_t>(dw.numel()), device), st,
             device_address(ws), device_address(dw));
  return true;
}

std::string conv_wgrad_source(const ConvSizes& s, DType t, int sm_count) {
  const int mma = conv_mma_for(t, t, t);
  return wgrad_applies(s, mma) ? source(s, plan_for(s, mma, sm_count), t) : std::string();
}

}  // namespace kiln::conv_detail
