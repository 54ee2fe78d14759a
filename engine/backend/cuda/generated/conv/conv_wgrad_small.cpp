// The wgrad_small kind: weight gradients with few weights and a long sum over pixels, on the
// CUDA cores, or on tensor cores for 16-bit operands with few taps and channels. How many
// images a block sums; the kernel and the reduce of its f32 workspace of per-block sums.
#include <algorithm>
#include <climits>
#include <memory>
#include <optional>

#include "backend/cuda/launch_common.h"
#include "backend/cuda/split_sums.h"
#include "conv_kinds.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/templates.h"

namespace kiln::kernels::conv_kinds {

namespace {

constexpr std::int64_t kThreads = 256;

}  // namespace

// On the CUDA cores: one kernel row (o, c, r) per thread, so at most a block's worth, rows up
// to 8 wide. About two blocks an SM: each block sums one image, or a band of an image's rows
// where the images are fewer (the cnn's conv1 at batch 128: three bands), so its staging and
// sums overlap another block's; the final sum reads a row per block (on the H200, four blocks
// an SM made the bf16 cnn step 0.7% slower and the speedrun 0.6%, eight 1% and 5%). Its f32 FMAs
// are exact f32's arithmetic too, but each thread sums its pixels in one register: exact f32
// takes it only where that run is at most 1024 products (a 300-image 64x64 conv's 6144 drifted
// past the tolerance the other f32 paths meet).
// On tensor cores (16-bit operands where a warp's 16 x 8 tiles of dw^T fit its registers, at
// most 64 sums a thread, or a run of the tap tiles does where the warps split them, as for the
// speedrun's conv2's 216 taps): whole images a block, about one block an SM. Its blocks' fixed costs
// (zeroing, the warps' and the blocks' sums) outweigh their MMAs: on the H200, bench_conv's
// graphs of the speedrun's conv1 (256 images) took 8.4 us in 256 blocks against 11.2 in 512 and
// 10.4 in 86 (3 images each), the cnn's (128 images, 28 x 28) 6.2 us in 128 blocks against 8.3
// in 256 and 10.8 in 384. The speedrun's conv2 (216 taps, warps splitting them) took 9.2 + 3.6 us
// (kernel + reduce) in 256 blocks, 9.6 + 2.8 in 128, under ncu in its step.
std::optional<SmallWgradPlan> plan_wgrad_small(ConvPass pass, const ConvGeometry& s, DType t, ConvMath math,
                                               const ConvTarget& target) {
  const std::int64_t q = s.o * s.c * s.kh;
  if (pass != ConvPass::grad_weight || s.groups != 1 || q == 0 || s.kw > 8 || s.oh * s.ow <= 0 || s.n == 0 ||
      s.n > INT_MAX)
    return std::nullopt;
  SmallWgradPlan p;
  const std::size_t size = dtype_size(t);
  const std::int64_t taps = s.c * s.kh * s.kw, m_tiles = ceil_div(taps, 16), n_tiles = ceil_div(s.o, 8);
  const bool tensor_cores = math == ConvMath::bf16 || math == ConvMath::f16;
  // Split between the warps only where each has tap tiles: with fewer the tile engine's kernels
  // use the SMs better.
  constexpr std::int64_t warps = kThreads / 32;
  p.split_taps = tensor_cores && m_tiles * n_tiles > 16 && m_tiles >= warps && ceil_div(m_tiles, warps) * n_tiles <= 16;
  p.mma = tensor_cores && (m_tiles * n_tiles <= 16 || p.split_taps);
  if (!p.mma && q > kThreads) return std::nullopt;
  const std::int64_t sms = std::max(1, target.sm_count);
  p.ipb = std::max<std::int64_t>(1, s.n / (p.mma ? sms : 2 * sms));
  p.bands = std::clamp<std::int64_t>(ceil_div(p.mma ? sms / 2 : 2 * sms, s.n), 1, s.oh);
  p.rows = ceil_div(s.oh, p.bands);
  p.bands = ceil_div(s.oh, p.rows);
  p.blocks = ceil_div(s.n, p.ipb) * p.bands;
  const std::int64_t lanes = q <= kThreads / 2 ? kThreads / q : 1;
  if (math == ConvMath::f32 && p.ipb * ceil_div(p.rows, lanes) * s.ow > 1024) return std::nullopt;
  std::int64_t staged = 0, sums = lanes * q * s.kw * static_cast<std::int64_t>(sizeof(float));
  if (p.mma) {
    // Rows of output pixels up to 16 a channel, its run 8 mod 16 elements: 16-byte aligned, and
    // the B fragments' 8 channels x 4 pixel pairs on distinct banks.
    const std::int64_t owp = ceil_div(s.ow, 16) * 16;
    p.gy_stride = p.rows * owp;
    while (p.gy_stride % 16 != 8) ++p.gy_stride;
    const std::int64_t rows_in = (p.rows - 1) * s.sh + (s.kh - 1) * s.dh + 1;
    const std::int64_t width = ceil_div(std::max((owp - 1) * s.sw + (s.kw - 1) * s.dw + 1, s.w + 2 * s.pw), 2) * 2;
    staged = (n_tiles * 8 * p.gy_stride + (s.c + 1) * rows_in * width) * static_cast<std::int64_t>(size);
    const std::int64_t slabs = p.split_taps ? 1 : kThreads / 32;
    sums = slabs * n_tiles * 8 * (m_tiles * 16 + 4) * static_cast<std::int64_t>(sizeof(float));
  } else {
    // A row of odd 4-byte words (2-byte types: 2 mod 4 elements): neighbouring channels' rows
    // start in different banks.
    p.gy_stride = p.rows * s.ow;
    while (size == 2 ? p.gy_stride % 4 != 2 : p.gy_stride % 2 != 1) ++p.gy_stride;
    staged = (s.o * p.gy_stride + s.c * (s.h + 2 * s.ph) * (s.w + 2 * s.pw)) * static_cast<std::int64_t>(size);
  }
  p.smem = std::max(staged, sums);
  if (p.smem > target.max_shared || p.blocks > INT_MAX) return std::nullopt;
  return p;
}

std::string wgrad_small_source(const ConvLaunch& l) {
  const auto& p = std::get<SmallWgradPlan>(l.plan);
  rt::Bindings b = size_bindings(l.g, {"G", "N"});  // the batch is an argument
  b.push_back({"PRELUDE", rt::device_prelude(DTypes{l.dtype})});
  b.push_back({"WGRAD_SMALL_REDUCE", rt::template_source("row_sums") + rt::template_source("conv_wgrad_small_reduce")});
  if (p.mma) {
    b.push_back({"MMA_OPS", rt::template_source("mma")});
    b.push_back({"MMA", num(static_cast<int>(l.math))});
    b.push_back({"SPLIT_TAPS", p.split_taps ? "true" : "false"});
  }
  b.push_back({"T", std::string(cuda_storage_type(l.dtype))});
  b.push_back({"TD", p.f32_out ? std::string("float") : std::string(cuda_storage_type(l.dtype))});
  b.push_back({"IPB", num(p.ipb)});
  b.push_back({"BANDS", num(p.bands)});
  b.push_back({"BROWS", num(p.rows)});
  b.push_back({"GYS", num(p.gy_stride)});
  const char* name = p.mma ? "conv_wgrad_small_mma" : "conv_wgrad_small";
  return rt::instantiate(name, rt::template_source(name), b);
}

void launch_wgrad_small(const ConvLaunch& l, const ConvOperands& ops, Module m) {
  static_assert(kThreads == kSplitSumThreads, "the reduce sums as row_sums.cu's callers do");
  const auto& p = std::get<SmallWgradPlan>(l.plan);
  const rt::Stream& st = *ops.stream;
  const rt::Function fn = rt::generated_function(m, "kiln_conv_wgrad_small", st.device());
  const rt::Function reduce = rt::generated_function(m, "kiln_conv_wgrad_small_reduce", st.device());
  const std::int64_t weights = l.g.o * l.g.c * l.g.kh * l.g.kw;
  auto ws = std::make_shared<rt::DeviceBuffer>(sizeof(float) * static_cast<std::size_t>(p.blocks * weights), st);
  rt::LaunchConfig cfg;
  cfg.grid = {static_cast<unsigned>(p.blocks), 1, 1};
  cfg.block = {static_cast<unsigned>(kThreads), 1, 1};
  cfg.shared_bytes = static_cast<unsigned>(p.smem);
  rt::launch(fn, cfg, st, ops.a, ops.b, ws->ptr(), static_cast<int>(l.g.n));
  rt::LaunchConfig red;
  red.grid = {static_cast<unsigned>(ceil_div(weights, 32)), 1, 1};  // 32 weights a block
  red.block = {static_cast<unsigned>(kThreads), 1, 1};
  auto run_reduce = [reduce, red, ws, out = ops.out, blocks = static_cast<int>(p.blocks)](const rt::Stream& on) {
    rt::launch(reduce, red, on, ws->ptr(), out, blocks);
  };
  if (std::optional<DeferredSums>* into = deferred_sums()) {
    DeferredSums& d = into->emplace();
    d.sums.ws = ws->ptr();
    d.sums.rows = p.blocks;
    d.sums.columns = weights;
    d.sums.threads = kThreads;
    d.sums.keep = ws;
    d.run = std::move(run_reduce);
    return;
  }
  run_reduce(st);
}

}  // namespace kiln::kernels::conv_kinds
