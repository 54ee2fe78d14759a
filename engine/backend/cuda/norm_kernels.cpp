// Kernel specs and host launchers of kernel_templates/norm.cu (see norm_kernels.h).
#include "norm_kernels.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <initializer_list>
#include <string>

#include "kiln/error.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/templates.h"
#include "launch_common.h"

namespace kiln::kernels {

namespace {

using rt::KernelSpec;

// (x, parameters): same dtype, or f32 parameters for half x (mixed precision).
const std::vector<DTypes> kTuples{{DType::f32, DType::f32},   {DType::f64, DType::f64}, {DType::f16, DType::f16},
                                  {DType::bf16, DType::bf16}, {DType::f16, DType::f32}, {DType::bf16, DType::f32}};

// Pool paths: the window path a pooled kernel's module carries (KILN_POOL_PATH in norm.cu).
constexpr std::uint32_t kPoolPaths = 6;

const KernelSpec& register_norm_entry(const char* op, const char* entry, std::uint32_t paths = 1) {
  KernelSpec s;
  s.op = op;
  s.template_name = "norm";
  s.entry = entry;
  s.dtypes = kTuples;
  s.variants.clear();
  for (std::uint32_t v = 0; v < paths; ++v) s.variants.push_back(v);
  s.bind = [](const DTypes& d, std::uint32_t variant) -> rt::Bindings {
    rt::Bindings b{{"PRELUDE", rt::device_prelude(d)},
                   {"T", std::string(cuda_storage_type(d[0]))},
                   {"P", std::string(cuda_storage_type(d[1]))},
                   {"ACC", d[0] == DType::f64 ? "double" : "float"},
                   {"POOL_PATH", std::to_string(variant)}};
    b.push_back({"BN_POOL_WINDOW", rt::template_source("bn_pool_window")});
    return b;
  };
  return rt::register_kernel(std::move(s));
}

const KernelSpec& kBnStats = register_norm_entry("batch_norm_stats", "kiln_batch_norm_stats");
const KernelSpec& kBnApply = register_norm_entry("batch_norm_apply", "kiln_batch_norm_apply");
const KernelSpec& kBnMergeParts = register_norm_entry("batch_norm_merge_parts", "kiln_batch_norm_merge_parts");
const KernelSpec& kBnBackwardReduce =
    register_norm_entry("batch_norm_backward_reduce", "kiln_batch_norm_backward_reduce");
const KernelSpec& kBnBackwardDx = register_norm_entry("batch_norm_backward_dx", "kiln_batch_norm_backward_dx");
const KernelSpec& kBnMaxPool = register_norm_entry("batch_norm_max_pool", "kiln_batch_norm_max_pool", kPoolPaths);
const KernelSpec& kBnMaxPoolBackwardReduce =
    register_norm_entry("batch_norm_max_pool_backward_reduce", "kiln_batch_norm_max_pool_backward_reduce", kPoolPaths);
const KernelSpec& kBnMaxPoolBackwardDx =
    register_norm_entry("batch_norm_max_pool_backward_dx", "kiln_batch_norm_max_pool_backward_dx", kPoolPaths);
const KernelSpec& kLayerNorm = register_norm_entry("layer_norm", "kiln_layer_norm");
const KernelSpec& kLnBackwardDx = register_norm_entry("layer_norm_backward_dx", "kiln_layer_norm_backward_dx");
const KernelSpec& kLnBackwardParams =
    register_norm_entry("layer_norm_backward_params", "kiln_layer_norm_backward_params");
const KernelSpec& kBiasGrad = register_norm_entry("bias_grad", "kiln_bias_grad");
const KernelSpec& kNarrowLinearGrad = register_norm_entry("narrow_linear_grad", "kiln_narrow_linear_grad");

constexpr unsigned kBlock = 256;  // fixed by the template

rt::Function function(const KernelSpec& spec, DType t, DType p, const rt::Stream& s, std::uint32_t variant = 0) {
  return rt::get_function(spec, DTypes{t, p}, variant, s.device());
}

std::int64_t sm_count(int device) { return std::max(1, rt::device_info(device).sm_count); }
// The pooled forward and dx kernels: one wave of full SMs, each thread looping over a few
// windows. On the H200 the bf16 cnn step took 0.2257 ms at 8 blocks an SM, 0.2267 at 16 and
// 0.2277 at 32 (several waves of one window a thread); the speedrun 0.0500, 0.0504, 0.0504 s.
rt::LaunchConfig pool_config(std::uint64_t items, int device) {
  return rt::linear_config(items, 256, static_cast<unsigned>(sm_count(device)) * 8);
}

// `units` independent reductions of `count` values each, `per_block_min` values at least per
// block: as many splits as make `per_sm` blocks an SM.
NormSplit split_for(std::int64_t units, std::int64_t count, std::int64_t per_block_min, int device,
                    std::int64_t per_sm = 4) {
  NormSplit sp;
  if (count <= 0 || units <= 0) return sp;
  std::int64_t splits = std::max<std::int64_t>(1, ceil_div(per_sm * sm_count(device), units));
  splits = std::clamp<std::int64_t>(std::min(splits, ceil_div(count, per_block_min)), 1, 1024);
  sp.chunk = ceil_div(count, splits);
  sp.splits = static_cast<int>(ceil_div(count, sp.chunk));  // no split left empty
  return sp;
}

rt::LaunchConfig blocks(std::int64_t n) {
  rt::LaunchConfig c;
  c.grid.x = static_cast<unsigned>(n);
  c.block.x = kBlock;
  return c;
}

// A warp per row while a row is at most 32 loads per lane, else a block per row; grid-stride
// over the rows beyond 32 blocks per SM.

}  // namespace

bool norm_dtypes_supported(DType t, DType p) {
  return std::find(kTuples.begin(), kTuples.end(), DTypes{t, p}) != kTuples.end();
}

NormSplit batch_norm_split(const BatchNormShape& shape, int device) {
  // Two blocks an SM below 2^24 values, each summing twice the values: on the H200 the bf16 cnn
  // step took 0.2218 ms at two, 0.2235 at three, 0.2280 at four, 0.2347 at six (the speedrun
  // 0.0487, 0.0498, 0.0504, 0.0525 s), its statistics and backward sums spending less on block
  // starts, reductions and merges. Larger inputs keep four, for the loads in flight.
  const std::int64_t per_sm = shape.channels * shape.per_channel < (std::int64_t{1} << 24) ? 2 : 4;
  NormSplit sp = split_for(shape.channels, shape.per_channel, 4 * kBlock, device, per_sm);
  sp.scratch = 2 * shape.channels * sp.splits;
  return sp;
}

void launch_batch_norm_stats(const BatchNormForward& a, const BatchNormShape& shape, const NormSplit& split,
                             const rt::Stream& s) {
  const long long C = shape.channels, S = shape.spatial, M = shape.per_channel, chunk = split.chunk;
  const int splits = split.splits;
  if (C == 0) return;
  // Values a load: 16 bytes, else 8, where every image's row of a channel starts aligned.
  std::int32_t vec = 1;
  const std::int64_t size = static_cast<std::int64_t>(dtype_size(a.t));
  for (std::int64_t bytes : {16, 8})
    if (vec == 1 && bytes / size > 1 && S % (bytes / size) == 0 && a.x % 16 == 0)
      vec = static_cast<std::int32_t>(bytes / size);
  rt::launch(function(kBnStats, a.t, a.p, s), blocks(C * splits), s, a.x, a.parts, a.mean, a.invstd, a.running_mean,
             a.running_var, a.tracked, C, S, M, chunk, splits, a.momentum, a.eps, vec);
}

namespace {

// The apply kernels' statistics from totals or a conv's partials (training only): they then
// count the batch too.
struct FromTotals {
  rt::DevicePtr totals = 0, tracked = 0, parts = 0;
  long long rows = 0;
};
FromTotals from_totals(const BatchNormForward& a) {
  if (!a.training || (a.totals == 0 && a.conv_parts == 0)) return {};
  if (a.t == DType::f64) throw DTypeError("[batch_norm] channel totals serve f32, f16 and bf16 inputs, not f64");
  if (a.conv_parts != 0 && (a.conv_rows <= 0 || a.merged == 0))
    throw ValueError("[batch_norm] a conv's partial sums were given without their rows and merge buffer");
  return {a.conv_parts != 0 ? 0 : a.totals, a.tracked, a.conv_parts, a.conv_rows};
}

}  // namespace

void launch_batch_norm(const BatchNormForward& a, const BatchNormShape& shape, const NormSplit& split,
                       const rt::Stream& s) {
  const long long C = shape.channels, S = shape.spatial, total = shape.total();
  if (C == 0) return;
  FromTotals f = from_totals(a);
  if (f.parts != 0) {  // added up into totals first
    rt::launch(function(kBnMergeParts, a.t, a.p, s), blocks(2 * C), s, f.parts, f.rows, a.merged);
    f.totals = a.merged;
  }
  if (a.training && !f.totals) launch_batch_norm_stats(a, shape, split, s);
  const std::int32_t eval = a.training ? 0 : 1, relu = a.relu ? 1 : 0;
  // Eval writes the C saved statistics even for an empty batch.
  const auto items = static_cast<std::uint64_t>(std::max(total, a.training ? 0LL : C));
  if (items == 0) return;
  rt::launch(function(kBnApply, a.t, a.p, s), grid_stride_config(items, s.device()), s, a.x, a.weight, a.bias,
             a.running_mean, a.running_var, a.mean, a.invstd, a.y, total, C, S, eval, relu, a.eps, f.totals, f.tracked,
             a.momentum);
}

void launch_batch_norm_backward_reduce(const BatchNormBackward& a, const BatchNormShape& shape, const NormSplit& split,
                                       const rt::Stream& s) {
  const long long C = shape.channels, S = shape.spatial, M = shape.per_channel, chunk = split.chunk;
  const int splits = split.splits;
  const std::int32_t relu = a.relu ? 1 : 0;
  if (C == 0) return;
  rt::launch(function(kBnBackwardReduce, a.t, a.p, s), blocks(C * splits), s, a.g, a.x, a.y, a.mean, a.invstd, a.parts,
             a.sums, a.dweight, a.dbias, C, S, M, chunk, splits, relu);
}

void launch_batch_norm_backward_dx(const BatchNormBackward& a, const BatchNormShape& shape, std::int64_t count,
                                   const rt::Stream& s) {
  const long long C = shape.channels, S = shape.spatial, M = count, total = shape.total();
  const std::int32_t training = a.training ? 1 : 0, relu = a.relu ? 1 : 0;
  if (total == 0) return;
  rt::launch(function(kBnBackwardDx, a.t, a.p, s), grid_stride_config(static_cast<std::uint64_t>(total), s.device()), s,
             a.g, a.x, a.y, a.weight, a.mean, a.invstd, a.sums, a.dx, total, C, S, M, training, relu);
}

void launch_batch_norm_backward(const BatchNormBackward& a, const BatchNormShape& shape, const NormSplit& split,
                                const rt::Stream& s) {
  if (shape.channels == 0) return;
  launch_batch_norm_backward_reduce(a, shape, split, s);
  launch_batch_norm_backward_dx(a, shape, shape.per_channel, s);
}

namespace {

// Mirrors struct PoolTiles of norm.cu.
struct PoolTiles {
  long long planes, c, h, w, oh, ow, kh, kw;
};
PoolTiles tiles(const BatchNormPoolShape& p) {
  return {p.n * p.channels, p.channels, p.h, p.w, p.h / p.kh, p.w / p.kw, p.kh, p.kw};
}

std::atomic<bool> g_pool_groups{true};

// Windows a thread of the pooled kernels takes along a row: 4, else 2, where 2 x 2 windows tile
// the rows in such groups (and the columns, for dx: `whole`), offsets fit 32 bits and every
// pointer is aligned to a group's row of x; else 1.
std::int64_t pool_group(const BatchNormPoolShape& p, DType t, bool whole, std::initializer_list<rt::DevicePtr> ptrs) {
  if (!g_pool_groups.load(std::memory_order_relaxed) || p.kh != 2 || p.kw != 2 || (whole && p.h % 2 != 0) ||
      p.n * p.channels * p.h * p.w >= (std::int64_t{1} << 31))
    return 1;
  const auto size = static_cast<std::int64_t>(dtype_size(t));
  for (std::int64_t g : {4, 2}) {
    const bool aligned = std::all_of(
        ptrs.begin(), ptrs.end(), [&](rt::DevicePtr a) { return a % static_cast<rt::DevicePtr>(2 * g * size) == 0; });
    if (p.w % (2 * g) == 0 && aligned) return g;
  }
  return 1;
}

// The module variant (KILN_POOL_PATH of norm.cu) for windows taken `group` at a time.
std::uint32_t pool_path(const BatchNormPoolShape& p, std::int64_t group) {
  if (group > 1) return group == 4 ? 4 : 5;
  const bool narrow = p.n * p.channels * p.h * p.w < (std::int64_t{1} << 31), two_by_two = p.kh == 2 && p.kw == 2;
  return (narrow ? 0 : 2) + (two_by_two ? 0 : 1);
}

// C * bpc blocks for a channel-major kernel of `items` per channel: as many as the SMs hold at
// once, an even share a channel (at least one, which also writes the channel's constants).
rt::LaunchConfig channel_blocks(const rt::Function& fn, std::int64_t channels, std::int64_t items,
                                const rt::Stream& s) {
  const std::int64_t resident = rt::resident_blocks(fn, blocks(1), 8) * sm_count(s.device());
  return blocks(channels *
                std::clamp<std::int64_t>(ceil_div(items, kBlock), 1, std::max<std::int64_t>(1, resident / channels)));
}

}  // namespace

void set_batch_norm_pool_groups(bool on) { g_pool_groups.store(on, std::memory_order_relaxed); }

void launch_batch_norm_max_pool(const BatchNormForward& a, const BatchNormPoolShape& shape, const NormSplit& split,
                                const rt::Stream& s) {
  const long long C = shape.channels, windows = C * shape.windows_per_channel();
  if (C == 0) return;
  const FromTotals f = from_totals(a);
  if (a.training && !f.totals && !f.parts) launch_batch_norm_stats(a, shape.unpooled(), split, s);
  const std::int32_t eval = a.training ? 0 : 1, relu = a.relu ? 1 : 0;
  const std::int64_t group = pool_group(shape, a.t, false, {a.x, a.y});
  // Eval writes the C saved statistics even for an empty batch.
  const auto items = static_cast<std::uint64_t>(std::max(windows / group, a.training ? 0LL : C));
  if (items == 0) return;
  const rt::Function fn = function(kBnMaxPool, a.t, a.p, s, pool_path(shape, group));
  rt::LaunchConfig cfg = pool_config(items, s.device());
  if (f.parts != 0) {
    // Each of a channel's blocks adds up its partials: at most as many blocks as the SMs hold at
    // once (its registers allow four or five an SM, not the eight of pool_config), an even share
    // a channel, so none waits for a second wave.
    cfg = channel_blocks(fn, C, shape.windows_per_channel() / group, s);
  }
  rt::launch(fn, cfg, s, a.x, a.weight, a.bias, a.running_mean, a.running_var, a.mean, a.invstd, a.y, tiles(shape),
             eval, relu, a.eps, f.totals, f.tracked, a.momentum, f.parts, f.rows);
}

// About six windows a thread. With dx adding up the sums (one H200, 2026-12-01): the bf16 cnn
// step took 0.1558 ms at four and six, 0.1568 at eight and 0.1580 at twelve (the speedrun
// 0.0301-0.0302, 0.0301-0.0303, 0.0300-0.0303 and 0.0306-0.0308 s); the speedrun's first layer
// then has 24 splits, which dx loads in one round trip (up to 32). With the last block's merge at
// the reduction's end, eight had been best and two ran in three waves.
constexpr std::int64_t kPoolWindowsPerThread = 6;

NormSplit batch_norm_max_pool_split(const BatchNormPoolShape& shape, int /*device*/) {
  NormSplit sp;
  const std::int64_t m = shape.windows_per_channel();
  if (m > 0 && shape.channels > 0) {
    const std::int64_t splits = std::clamp<std::int64_t>(ceil_div(m, kPoolWindowsPerThread * kBlock), 1, 1024);
    sp.chunk = ceil_div(ceil_div(m, splits), 4) * 4;  // blocks start at a group of windows (pool_group)
    sp.splits = static_cast<int>(ceil_div(m, sp.chunk));
  }
  sp.scratch = 2 * shape.channels * std::max(sp.splits, 1);
  return sp;
}

void launch_batch_norm_max_pool_backward(const BatchNormBackward& a, const BatchNormPoolShape& shape,
                                         const NormSplit& split, const rt::Stream& s) {
  const long long C = shape.channels, chunk = split.chunk;
  const int splits = std::max(split.splits, 1);
  const std::int32_t relu = a.relu ? 1 : 0;
  if (C == 0) return;
  // With no windows the blocks still run: they park zero sums, and dx's write zero dweight, dbias.
  const std::int64_t sum_group = chunk % 4 == 0 ? pool_group(shape, a.t, false, {a.g, a.x}) : 1;
  rt::launch(function(kBnMaxPoolBackwardReduce, a.t, a.p, s, pool_path(shape, sum_group)), blocks(C * splits), s, a.g,
             a.x, a.weight, a.bias, a.mean, a.invstd, a.parts, tiles(shape), chunk, splits, relu);
  launch_batch_norm_max_pool_backward_dx(a, shape, splits, s);
}

void launch_batch_norm_max_pool_backward_dx(const BatchNormBackward& a, const BatchNormPoolShape& shape,
                                            std::int64_t splits, const rt::Stream& s) {
  const long long C = shape.channels;
  const std::int32_t training = a.training ? 1 : 0, relu = a.relu ? 1 : 0, parts = static_cast<std::int32_t>(splits);
  if (C == 0) return;
  if (splits < 1 || splits > INT_MAX)
    throw ValueError("[batch_norm_max_pool2d_backward] " + std::to_string(splits) + " splits of parked sums");
  // dx's blocks take a channel each and add up its sums (no merge at the reduction's end). Blocks
  // the SMs hold at once beat one item a thread (more blocks, each adding up the sums): the
  // speedrun 0.0297-0.0298 s against 0.0301-0.0303 on one H200.
  const std::int64_t group = pool_group(shape, a.t, true, {a.g, a.x, a.dx});
  const std::int64_t cells = group > 1 ? shape.windows_per_channel() / group
                                       : shape.n * ceil_div(shape.h, shape.kh) * ceil_div(shape.w, shape.kw);
  const rt::Function dx = function(kBnMaxPoolBackwardDx, a.t, a.p, s, pool_path(shape, group));
  const long long count = shape.unpooled().per_channel;
  rt::launch(dx, channel_blocks(dx, C, cells, s), s, a.g, a.x, a.weight, a.bias, a.mean, a.invstd, a.parts, a.dweight,
             a.dbias, a.dx, tiles(shape), count, parts, training, relu);
}

void launch_layer_norm(DType t, DType p, rt::DevicePtr x, rt::DevicePtr weight, rt::DevicePtr bias, rt::DevicePtr y,
                       rt::DevicePtr mean, rt::DevicePtr invstd, std::int64_t rows, std::int64_t cols, double eps,
                       const rt::Stream& s) {
  if (rows == 0) return;
  const RowLaunch l = row_launch(rows, cols, s.device());
  const long long r = rows, k = cols;
  rt::launch(function(kLayerNorm, t, p, s), l.config, s, x, weight, bias, y, mean, invstd, r, k, l.width, eps);
}

NormSplit layer_norm_split(std::int64_t rows, std::int64_t cols, int device) {
  NormSplit sp = split_for(ceil_div(cols, 32), rows, 8, device);
  sp.scratch = 2 * static_cast<std::int64_t>(sp.splits) * cols;
  return sp;
}

// At least 32 rows a block: four per thread, whose loads are issued together. With `whole`, up
// to 256 rows (32 a warp) one block takes a column's rows: no merge and no counter
// (splits == 1), so it may run beside the backward's chain; a masked gradient, which stays on
// the chain, is faster split (4.3 against 6.3 µs for the speedrun's fc1).
NormSplit bias_grad_split(std::int64_t rows, std::int64_t cols, int device, bool whole) {
  NormSplit sp = whole && rows <= 256 ? NormSplit{.splits = 1, .chunk = std::max<std::int64_t>(rows, 1)}
                                      : split_for(ceil_div(cols, 32), rows, 32, device);
  sp.scratch = static_cast<std::int64_t>(sp.splits) * cols;
  return sp;
}

void launch_bias_grad(const BiasGrad& a, std::int64_t rows, std::int64_t cols, const NormSplit& split,
                      const rt::Stream& s) {
  if (cols == 0) return;
  // With no rows the blocks still run: the last one writes the zero sums.
  const long long r = rows, k = cols, per_split = split.chunk;
  const int splits = std::max(split.splits, 1);
  rt::launch(function(kBiasGrad, a.t, a.p, s), blocks(ceil_div(cols, 32) * splits), s, a.g, a.y, a.gp, a.parts, a.db, r,
             k, per_split, splits);
}

void launch_narrow_linear_grad(const NarrowLinearGrad& a, std::int64_t rows, std::int64_t n, std::int64_t cols,
                               const rt::Stream& s) {
  if (n < 0 || n > kNarrowLinearOutputs)
    throw ValueError("[linear_grad_wb] the narrow kernel takes at most " + std::to_string(kNarrowLinearOutputs) +
                     " outputs, got " + std::to_string(n));
  if (n == 0 && a.db_below == 0) return;
  // With no rows the blocks still run: they write the zero sums.
  const long long r = rows, k = cols;
  const std::int32_t outputs = static_cast<std::int32_t>(n);
  if ((a.db_below != 0 && a.below == 0 && rows > 0) || (a.below != 0 && a.db_below == 0))
    throw ValueError("[linear_grad_wb] the narrow kernel's layer below needs both its gradient and its bias gradient");
  rt::launch(function(kNarrowLinearGrad, a.t, a.p, s), blocks(ceil_div(cols, 32) + 1), s, a.g, a.x, a.below, a.dw, a.db,
             a.db_below, r, outputs, k);
}

void launch_layer_norm_backward(const LayerNormBackward& a, std::int64_t rows, std::int64_t cols,
                                const NormSplit& split, const rt::Stream& s) {
  const long long r = rows, k = cols;
  if (rows > 0) {
    const RowLaunch l = row_launch(rows, cols, s.device());
    rt::launch(function(kLnBackwardDx, a.t, a.p, s), l.config, s, a.g, a.x, a.weight, a.mean, a.invstd, a.dx, r, k,
               l.width);
  }
  if ((a.dweight == 0 && a.dbias == 0) || cols == 0) return;
  // With no rows the blocks still run: the last one writes the zero sums.
  const long long per_split = split.chunk;
  const int splits = split.splits;
  rt::launch(function(kLnBackwardParams, a.t, a.p, s), blocks(ceil_div(cols, 32) * splits), s, a.g, a.x, a.mean,
             a.invstd, a.parts, a.dweight, a.dbias, r, k, per_split, splits);
}

}  // namespace kiln::kernels
