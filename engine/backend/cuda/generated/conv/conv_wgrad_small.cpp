// The wgrad_small kind: weight gradients with few weights and a long sum over pixels, on the
// CUDA cores. How many images a block sums; the kernel and the reduce of its f32 workspace of
// per-block sums.
#include <algorithm>

#include "backend/cuda/launch_common.h"
#include "conv_kinds.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/templates.h"

namespace kiln::kernels::conv_kinds {

namespace {

constexpr std::int64_t kThreads = 256;

}  // namespace

// One kernel row (o, c, r) per thread, so at most a block's worth, rows up to 8 wide; one
// image per block and SM at most: the fewer blocks, the shorter the final sum. For a first conv
// over few channels, whose long sum over pixels tensor-core tiles would spread thin. Its f32
// FMAs are exact f32's arithmetic too, but each thread sums its pixels in one register: exact
// f32 takes it only where that run is at most 1024 products (a 300-image 64x64 conv's 6144
// drifted past the tolerance the other f32 paths meet).
std::optional<SmallWgradPlan> plan_wgrad_small(ConvPass pass, const ConvGeometry& s, DType t, ConvMath math,
                                               const ConvTarget& target) {
  const std::int64_t q = s.o * s.c * s.kh;
  if (pass != ConvPass::grad_weight || s.groups != 1 || q > kThreads || q == 0 || s.kw > 8 ||
      s.oh * s.ow <= 0 || s.n == 0)
    return std::nullopt;
  SmallWgradPlan p;
  p.ipb = std::max<std::int64_t>(1, ceil_div(s.n, std::max(1, target.sm_count)));
  p.blocks = ceil_div(s.n, p.ipb);
  const std::int64_t lanes = q <= kThreads / 2 ? kThreads / q : 1;
  if (math == ConvMath::f32 && p.ipb * ceil_div(s.oh, lanes) * s.ow > 1024) return std::nullopt;
  const std::int64_t staged = (s.o * s.oh * s.ow + s.c * (s.h + 2 * s.ph) * (s.w + 2 * s.pw)) *
                              static_cast<std::int64_t>(dtype_size(t));
  p.smem = std::max(staged, lanes * q * s.kw * static_cast<std::int64_t>(sizeof(float)));
  if (p.smem > target.max_shared) return std::nullopt;
  return p;
}

std::string wgrad_small_source(const ConvLaunch& l) {
  const auto& p = std::get<SmallWgradPlan>(l.plan);
  rt::Bindings b = size_bindings(l.g, {"G"});
  b.push_back({"PRELUDE", rt::device_prelude(DTypes{l.dtype})});
  b.push_back({"T", std::string(cuda_storage_type(l.dtype))});
  b.push_back({"IPB", num(p.ipb)});
  return rt::instantiate("conv_wgrad_small", rt::template_source("conv_wgrad_small"), b);
}

void launch_wgrad_small(const ConvLaunch& l, const ConvOperands& ops, Module m) {
  const auto& p = std::get<SmallWgradPlan>(l.plan);
  const rt::Stream& st = *ops.stream;
  const rt::Function fn = rt::generated_function(m, "kiln_conv_wgrad_small", st.device());
  const rt::Function reduce = rt::generated_function(m, "kiln_conv_wgrad_small_reduce", st.device());
  const std::int64_t weights = l.g.o * l.g.c * l.g.kh * l.g.kw;
  const rt::DeviceBuffer ws(sizeof(float) * static_cast<std::size_t>(p.blocks * weights), st);
  rt::LaunchConfig cfg;
  cfg.grid = {static_cast<unsigned>(p.blocks), 1, 1};
  cfg.block = {static_cast<unsigned>(kThreads), 1, 1};
  cfg.shared_bytes = static_cast<unsigned>(p.smem);
  rt::launch(fn, cfg, st, ops.a, ops.b, ws.ptr());
  rt::LaunchConfig red;
  red.grid = {static_cast<unsigned>(ceil_div(weights * 32, kThreads)), 1, 1};  // a warp per weight
  red.block = {static_cast<unsigned>(kThreads), 1, 1};
  rt::launch(reduce, red, st, ws.ptr(), ops.out);
}

}  // namespace kiln::kernels::conv_kinds
