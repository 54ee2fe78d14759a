// The wgrad_small kind: weight gradients with few weights and a long sum over pixels, on the
// CUDA cores. How many images a block sums; the kernel and the reduce of its f32 workspace of
// per-block sums.
#include <algorithm>
#include <climits>

#include "backend/cuda/launch_common.h"
#include "conv_kinds.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/templates.h"

namespace kiln::kernels::conv_kinds {

namespace {

constexpr std::int64_t kThreads = 256;

}  // namespace

// One kernel row (o, c, r) per thread, so at most a block's worth, rows up to 8 wide. About
// two blocks an SM: each block sums one image, or a band of an image's rows where the images
// are fewer (the cnn's conv1 at batch 128: three bands), so its staging and sums overlap another
// block's; the final sum reads a row per block (on the H200, four blocks an SM made the bf16
// cnn step 0.7% slower and the speedrun 0.6%, eight 1% and 5%). Its f32 FMAs are exact f32's arithmetic too, but
// each thread sums its pixels in one register: exact f32 takes it only where that run is at
// most 1024 products (a 300-image 64x64 conv's 6144 drifted past the tolerance the other f32
// paths meet).
std::optional<SmallWgradPlan> plan_wgrad_small(ConvPass pass, const ConvGeometry& s, DType t, ConvMath math,
                                               const ConvTarget& target) {
  const std::int64_t q = s.o * s.c * s.kh;
  if (pass != ConvPass::grad_weight || s.groups != 1 || q > kThreads || q == 0 || s.kw > 8 || s.oh * s.ow <= 0 ||
      s.n == 0 || s.n > INT_MAX)
    return std::nullopt;
  SmallWgradPlan p;
  const std::int64_t want = 2 * static_cast<std::int64_t>(std::max(1, target.sm_count));
  p.ipb = std::max<std::int64_t>(1, s.n / want);
  p.bands = std::clamp<std::int64_t>(ceil_div(want, s.n), 1, s.oh);
  p.rows = ceil_div(s.oh, p.bands);
  p.bands = ceil_div(s.oh, p.rows);
  p.blocks = ceil_div(s.n, p.ipb) * p.bands;
  const std::int64_t lanes = q <= kThreads / 2 ? kThreads / q : 1;
  if (math == ConvMath::f32 && p.ipb * ceil_div(p.rows, lanes) * s.ow > 1024) return std::nullopt;
  // A row of odd 4-byte words (2-byte types: 2 mod 4 elements): neighbouring channels' rows
  // start in different banks.
  const std::size_t size = dtype_size(t);
  p.gy_stride = p.rows * s.ow;
  while (size == 2 ? p.gy_stride % 4 != 2 : p.gy_stride % 2 != 1) ++p.gy_stride;
  const std::int64_t staged = (s.o * p.gy_stride + s.c * (s.h + 2 * s.ph) * (s.w + 2 * s.pw)) *
                              static_cast<std::int64_t>(size);
  p.smem = std::max(staged, lanes * q * s.kw * static_cast<std::int64_t>(sizeof(float)));
  if (p.smem > target.max_shared || p.blocks > INT_MAX) return std::nullopt;
  return p;
}

std::string wgrad_small_source(const ConvLaunch& l) {
  const auto& p = std::get<SmallWgradPlan>(l.plan);
  rt::Bindings b = size_bindings(l.g, {"G", "N"});  // the batch is an argument
  b.push_back({"PRELUDE", rt::device_prelude(DTypes{l.dtype})});
  b.push_back({"T", std::string(cuda_storage_type(l.dtype))});
  b.push_back({"TD", p.f32_out ? std::string("float") : std::string(cuda_storage_type(l.dtype))});
  b.push_back({"IPB", num(p.ipb)});
  b.push_back({"BANDS", num(p.bands)});
  b.push_back({"BROWS", num(p.rows)});
  b.push_back({"GYS", num(p.gy_stride)});
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
  rt::launch(fn, cfg, st, ops.a, ops.b, ws.ptr(), static_cast<int>(l.g.n));
  rt::LaunchConfig red;
  red.grid = {static_cast<unsigned>(ceil_div(weights * 32, kThreads)), 1, 1};  // a warp per weight
  red.block = {static_cast<unsigned>(kThreads), 1, 1};
  rt::launch(reduce, red, st, ws.ptr(), ops.out, static_cast<int>(p.blocks));
}

}  // namespace kiln::kernels::conv_kinds
