// The wgrad kind: stride-1 weight gradients from staged gy and input rows. Picks the channel
// tile and how many images a block sums; launches the kernel and the reduce of its f32
// workspace of per-group sums.
#include <algorithm>

#include "backend/cuda/launch_common.h"
#include "conv_kinds.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/templates.h"

namespace kiln::kernels::conv_kinds {

namespace {

// Shared memory of the kernel's gy rows and staged input rows (mirrors conv_wgrad.cu).
std::int64_t smem_bytes(const ConvGeometry& s, ConvMath math, int bc) {
  const bool tf32 = math == ConvMath::tf32;
  const std::int64_t ohw = s.oh * s.ow, el = tf32 ? 4 : 2;
  const std::int64_t kp = tf32 ? (ceil_div(ohw, 8) * 8 + 27) / 32 * 32 + 4 : ceil_div(ohw, 16) * 16 + 8;
  const std::int64_t pwc = s.ow + (s.kw - 1) * s.dw, cp = bc + 8;
  return (64 * kp + (s.oh * pwc + 1) * cp) * el;
}

}  // namespace

// Channels in 8s: with one channel (the MNIST cnn's conv1: 121 us against the implicit GEMM's
// 80 in bf16 on the H100) most of the staged rows would be zeros. About four blocks per SM, so
// one block's staging overlaps another's products (at one per SM the speedrun's conv2 took
// 113 us, mostly waiting on loads); more groups only add to the reduce.
std::optional<WgradPlan> plan_wgrad(ConvPass pass, const ConvGeometry& s, ConvMath math, const ConvTarget& target) {
  const std::int64_t cg = s.cg(), og = s.og();
  if (pass != ConvPass::grad_weight || !tensor_cores(math) || s.sh != 1 || s.sw != 1 || cg <= 0 || cg % 8 != 0 ||
      s.oh * s.ow <= 0 || s.kw > 8 || s.n == 0 || og == 0)
    return std::nullopt;
  WgradPlan p;
  p.bc = static_cast<int>(std::min<std::int64_t>(32, cg));  // 8, 16, 24 or 32 channels
  p.o_tiles = ceil_div(og, 64);
  p.c_tiles = ceil_div(cg, p.bc);
  const std::int64_t per_group = s.kh * p.o_tiles * p.c_tiles * s.groups;
  const std::int64_t want = std::max<std::int64_t>(1, ceil_div(4 * std::max(1, target.sm_count), per_group));
  p.ipb = ceil_div(s.n, std::min(want, s.n));
  p.groups_of_images = ceil_div(s.n, p.ipb);
  p.smem = smem_bytes(s, math, p.bc);
  if (p.smem > target.max_shared) return std::nullopt;
  return p;
}

std::string wgrad_source(const ConvLaunch& l) {
  const auto& p = std::get<WgradPlan>(l.plan);
  const DType mt = l.math == ConvMath::f16 ? DType::f16 : DType::bf16;
  const std::string ty(cuda_storage_type(l.dtype));
  rt::Bindings b = size_bindings(l.g, {"SH", "SW"});
  for (auto& kv : rt::Bindings{{"MMA_OPS", rt::template_source("mma")},
                               {"PRELUDE", rt::device_prelude(DTypes{l.dtype, mt})},
                               {"TX", ty},
                               {"TO", ty},
                               {"MMA", num(static_cast<int>(l.math))},
                               {"BC", num(p.bc)},
                               {"IPB", num(p.ipb)}})
    b.push_back(std::move(kv));
  return rt::instantiate("conv_wgrad", rt::template_source("conv_wgrad"), b);
}

void launch_wgrad(const ConvLaunch& l, const ConvOperands& ops, Module m) {
  const auto& p = std::get<WgradPlan>(l.plan);
  const rt::Stream& st = *ops.stream;
  const rt::Function fn = rt::generated_function(m, "kiln_conv_wgrad", st.device());
  const rt::Function reduce = rt::generated_function(m, "kiln_conv_wgrad_reduce", st.device());
  const std::int64_t weights = l.g.o * l.g.cg() * l.g.kh * l.g.kw;
  const rt::DeviceBuffer ws(sizeof(float) * static_cast<std::size_t>(p.groups_of_images * weights), st);
  rt::LaunchConfig cfg;
  cfg.grid = {static_cast<unsigned>(l.g.kh), static_cast<unsigned>(p.o_tiles * p.c_tiles),
              static_cast<unsigned>(l.g.groups * p.groups_of_images)};
  cfg.block = {128, 1, 1};
  cfg.shared_bytes = static_cast<unsigned>(p.smem);
  rt::launch(fn, cfg, st, ops.a, ops.b, ws.ptr());
  rt::launch(reduce, grid_stride_config(static_cast<std::uint64_t>(weights), st.device()), st, ws.ptr(), ops.out);
}

}  // namespace kiln::kernels::conv_kinds
