// Weight gradients with few weights and a long sum over pixels, on CUDA cores
// (kernel_templates/conv_wgrad_small.cu): how many images a block sums, the shape's kernels
// registered on first use, and their launch with an f32 workspace of per-block sums.
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

constexpr std::int64_t kThreads = 256;


// One kernel row (o, c, r) per thread, so at most a block's worth; rows up to 8 wide.
bool small_wgrad_applies(const ConvSizes& s, int mma) {
  return mma >= 0 && s.groups == 1 && s.o * s.c * s.kh <= kThreads && s.kw <= 8 && s.oh * s.ow > 0;
}

struct SmallPlan {
  std::int64_t ipb = 1, blocks = 1, smem = 0;
};

// One image per block and SM at most: the fewer blocks, the shorter the final sum.
SmallPlan plan_for(const ConvSizes& s, DType t, int sms) {
  SmallPlan p;
  p.ipb = std::max<std::int64_t>(1, ceil_div(s.n, sms));
  p.blocks = ceil_div(s.n, p.ipb);
  const std::int64_t q = s.o * s.c * s.kh, lanes = q <= kThreads / 2 ? kThreads / q : 1;
  const std::int64_t staged = (s.o * s.oh * s.ow + s.c * (s.h + 2 * s.ph) * (s.w + 2 * s.pw)) *
                              static_cast<std::int64_t>(dtype_size(t));
  p.smem = std::max(staged, lanes * q * s.kw * static_cast<std::int64_t>(sizeof(float)));
  return p;
}

std::string source(const ConvSizes& s, const SmallPlan& p, DType t) {
  auto num = [](std::int64_t v) { return std::to_string(v); };
  const rt::Bindings b{{"PRELUDE", rt::device_prelude(DTypes{t})}, {"T", std::string(cuda_storage_type(t))},
                       {"N", num(s.n)},   {"C", num(s.c)},   {"H", num(s.h)},   {"W", num(s.w)},
                       {"O", num(s.o)},   {"KH", num(s.kh)}, {"KW", num(s.kw)}, {"OH", num(s.oh)},
                       {"OW", num(s.ow)}, {"SH", num(s.sh)}, {"SW", num(s.sw)}, {"PH", num(s.ph)},
                       {"PW", num(s.pw)}, {"DH", num(s.dh)}, {"DW", num(s.dw)}, {"IPB", num(p.ipb)}};
  return rt::instantiate("conv_wgrad_small", rt::template_source("conv_wgrad_small"), b);
}

}  // namespace

bool run_conv_wgrad_small(const ConvSizes& s, const Tensor& x, const Tensor& gy, const Tensor& dw, bool launch) {
  const int mma = conv_mma_for(x.dtype(), gy.dtype(), dw.dtype());
  if (!small_wgrad_applies(s, mma) || dw.numel() == 0 || s.n == 0) return false;
  const rt::DeviceInfo* info = generated_conv_device({&dw, &x, &gy});
  if (!info) return false;
  const int device = dw.device().index();
  const SmallPlan p = plan_for(s, dw.dtype(), std::max(1, info->sm_count));
  if (p.smem > std::max(48 * 1024, info->max_shared_optin)) return false;
  if (!launch) return true;
  rt::GeneratedKey key("conv_wgrad_small");
  key.add(dw.dtype(), p.ipb);
  add_sizes(key, s);
  const auto specs = rt::generated_kernels(key, [&] {
    return rt::GeneratedModule{source(s, p, dw.dtype()), "conv2d wgrad small",
                               {"kiln_conv_wgrad_small", "kiln_conv_wgrad_small_reduce"}};
  });
  const rt::Function fn = rt::get_function(*specs[0], DTypes{DType::u8}, 0, device);
  const rt::Function reduce = rt::get_function(*specs[1], DTypes{DType::u8}, 0, device);
  const Tensor ws = empty({p.blocks * dw.numel()}, {.dtype = DType::f32, .device = dw.device()});
  const rt::Stream& st = stream_of(dw.device());
  rt::LaunchConfig cfg;
  cfg.grid = {static_cast<unsigned>(p.blocks), 1, 1};
  cfg.block = {static_cast<unsigned>(kThreads), 1, 1};
  cfg.shared_bytes = static_cast<unsigned>(p.smem);
  rt::launch(fn, cfg, st, device_address(x), device_address(gy), device_address(ws));
  rt::LaunchConfig red;
  red.grid = {static_cast<unsigned>(ceil_div(dw.numel() * 32, kThreads)), 1, 1};  // a warp per weight
  red.block = {static_cast<unsigned>(kThreads), 1, 1};
  rt::launch(reduce, red, st, device_address(ws), device_address(dw));
  return true;
}

std::string conv_wgrad_small_source(const ConvSizes& s, DType t, int sm_count) {
  return small_wgrad_applies(s, conv_mma_for(t, t, t)) ? source(s, plan_for(s, t, sm_count), t) : std::string();
}

}  // namespace kiln::conv_detail
