// The tile engine's convolution modes on the host: which geometries fit, the weight gradient's
// layouts and plan, and each launch's staging kernels and tensor maps (gemm_internal.h).
#include <algorithm>
#include <array>
#include <memory>
#include <vector>

#include "backend/cuda/generated/conv/conv_kept.h"
#include "backend/cuda/generated/conv/conv_run.h"
#include "backend/cuda/launch_common.h"
#include "gemm_internal.h"
#include "kiln/error.h"
#include "kiln/runtime/kernel_plan.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/memory.h"

namespace kiln::kernels {

namespace {

// kiln_nchw_to_nhwc over `images` images of c channels by `pixels` pixels, in its 64 x 64 tiles
// (`odd`: the paired slices' inf-or-NaN word, or 0).
void launch_nhwc(const GemmLaunch& l, rt::DevicePtr x, rt::DevicePtr dst, std::int64_t c, std::int64_t pixels,
                 std::int64_t images, const rt::Stream& stream, rt::DevicePtr odd = 0) {
  int channels = static_cast<int>(c), p = static_cast<int>(pixels);
  void* args[] = {&x, &dst, &channels, &p, &odd};
  rt::LaunchConfig cfg;
  cfg.grid.x = static_cast<unsigned>(ceil_div(pixels, 64));
  cfg.grid.y = static_cast<unsigned>(ceil_div(c, 64));
  cfg.grid.z = static_cast<unsigned>(images);
  cfg.block.x = 32;
  cfg.block.y = 8;
  const rt::Function fn = staging_function(GemmStaging::nchw_to_nhwc, input_dtype(l.g.math), slices(l.g), stream.device());
  rt::launch_raw(fn, cfg, stream, args);
}

using kept::KeptCopy;

// Convolution modes' images (and gy in weight-gradient mode), `stride` elements apart, as dense
// [z][h][w][c] (convolution mode's f32 math: c as its slices). Under a ConvStagingReuse, a copy
// made earlier of the same operand is used again (not for paired slices, which also set `odd`);
// under a ConvForBackward of the images, a forward's one-slice copy of its images is kept for their
// weight gradient, which takes it.
std::shared_ptr<const rt::DeviceBuffer> stage_nhwc(const GemmLaunch& l, rt::DevicePtr x, std::int64_t c,
                                                   std::int64_t pixels, std::int64_t stride, const rt::Stream& stream,
                                                   rt::DevicePtr odd = 0) {
  const std::int64_t image = l.g.batch > 1 ? stride : c * pixels;
  if (image != c * pixels)
    throw ValueError("[gemm] convolution mode reads dense images; batch stride " + std::to_string(image));
  const KeptCopy key{x, c, pixels, l.g.batch, input_dtype(l.g.math), slices(l.g), stream.handle(), nullptr};
  const bool reuse = kept::reusing() && odd == 0;
  if (reuse)
    if (auto copy = kept::reused(key)) return copy;
  const kept::OperandScope* scope = odd == 0 && key.slices == 1 ? kept::images_scope(x) : nullptr;
  std::shared_ptr<const rt::DeviceBuffer> out =
      scope && l.g.conv->weight_grad ? kept::take_for_backward(key, *scope) : nullptr;
  if (!out) {
    auto made = std::make_shared<rt::DeviceBuffer>(
        static_cast<std::size_t>(l.g.batch * slices(l.g) * c * pixels) * dtype_size(input_dtype(l.g.math)), stream);
    launch_nhwc(l, x, made->ptr(), c, pixels, l.g.batch, stream, odd);
    out = std::move(made);
  }
  KeptCopy copy = key;
  copy.copy = out;
  if (reuse) kept::keep_for_reuse(copy);
  if (scope && !l.g.conv->weight_grad) kept::keep_for_backward(copy, *scope);
  return out;
}

// Convolution mode's A: the weights as [m][r][s][c] (f32 math: c as its slices), from
// [m][c][r][s] (or, flipped, from [c][m][r][s] with the taps reversed), in a stream-ordered buffer.
// Under a ConvForBackward of the weights, a forward's one-slice reorder also writes the flipped copy its
// input gradient reads, kept for it; that input gradient takes it instead of reordering.
std::shared_ptr<const rt::DeviceBuffer> reorder_weights(const GemmLaunch& l, const GemmOperands& ops,
                                                        rt::DevicePtr odd) {
  const GemmConv& c = *l.g.conv;
  const std::int64_t count = l.g.m * c.r * c.s * c.c;
  const std::int64_t staged = l.g.m * c.r * c.s * staged_channels(l.g);
  const DType t = input_dtype(l.g.math);
  const kept::OperandScope* scope = slices(l.g) == 1 ? kept::weights_scope(ops.a) : nullptr;
  // The input gradient's view: m and c swapped.
  auto flipped_key = [&](std::int64_t m, std::int64_t cc) {
    return KeptCopy{ops.a, cc, c.r * c.s, m, t, 1, ops.stream->handle(), nullptr, kept::CopyOf::flipped_weights};
  };
  if (scope && c.flip)
    if (auto copy = kept::take_for_backward(flipped_key(l.g.m, c.c), *scope)) return copy;
  const std::size_t bytes = static_cast<std::size_t>(staged) * dtype_size(t);
  auto out = std::make_shared<rt::DeviceBuffer>(bytes, *ops.stream);
  std::shared_ptr<rt::DeviceBuffer> flipped;
  if (scope && !c.flip) flipped = std::make_shared<rt::DeviceBuffer>(bytes, *ops.stream);
  rt::DevicePtr w = ops.a, dst = out->ptr(), dst_flipped = flipped ? flipped->ptr() : 0;
  int m = static_cast<int>(l.g.m), cc = static_cast<int>(c.c), taps = static_cast<int>(c.r * c.s), flip = c.flip;
  void* args[] = {&w, &dst, &dst_flipped, &m, &cc, &taps, &flip, &odd};
  rt::LaunchConfig cfg;
  cfg.grid.x = static_cast<unsigned>(std::min<std::int64_t>(ceil_div(count, 256), 1024));
  cfg.block.x = 256;
  rt::launch_raw(staging_function(GemmStaging::weights_rsc, t, slices(l.g), ops.stream->device()), cfg, *ops.stream,
                 args);
  if (flipped) {
    KeptCopy k = flipped_key(c.c, l.g.m);
    k.copy = std::move(flipped);
    kept::keep_for_backward(k, *scope);
  }
  return out;
}

// Weight-gradient mode's K-major copies: each of `planes` planes (h x w) as `copies` planes of
// `rows` x `row`, copy s shifted by s - pad_w and framed by pad_h zero rows (see WgradLayout).
struct ShiftedRows {
  std::int64_t h, w, rows, row, copies, pad_h, pad_w;
};
// Paired f32 slices: the copies hold hi, and as many past them lo (`odd` set where x holds inf
// or NaN).
rt::DeviceBuffer shift_rows(const GemmLaunch& l, rt::DevicePtr x, std::int64_t channels, std::int64_t stride,
                            const ShiftedRows& s, const rt::Stream& stream, rt::DevicePtr odd) {
  if (l.g.batch > 1 && stride != channels * s.h * s.w)
    throw ValueError("[gemm] weight-gradient mode copies dense images; batch stride " + std::to_string(stride));
  long long planes = l.g.batch * channels;
  const std::int64_t all_rows = (l.g.conv->paired ? 2 : 1) * s.copies * planes * s.rows;
  rt::DeviceBuffer out(static_cast<std::size_t>(all_rows * s.row) * dtype_size(input_dtype(l.g.math)), stream);
  rt::DevicePtr dst = out.ptr();
  int h = static_cast<int>(s.h), w = static_cast<int>(s.w), rows = static_cast<int>(s.rows);
  int row = static_cast<int>(s.row), copies = static_cast<int>(s.copies);
  int ph = static_cast<int>(s.pad_h), pw = static_cast<int>(s.pad_w);
  // About 256 16-byte chunks a block (one a thread), in whole planes: small copies still spread
  // over every SM.
  const std::int64_t chunks = s.rows * s.row * dtype_size(input_dtype(l.g.math)) / 16;
  int per_block = static_cast<int>(std::max<std::int64_t>(1, 256 / chunks));
  void* args[] = {&x, &dst, &planes, &h, &w, &rows, &row, &copies, &ph, &pw, &per_block, &odd};
  rt::LaunchConfig cfg;
  cfg.grid.x = static_cast<unsigned>(std::min<std::int64_t>(ceil_div(planes, per_block), 1 << 22));
  cfg.block.x = 256;
  const rt::Function fn = staging_function(GemmStaging::shift_rows, input_dtype(l.g.math), l.g.conv->paired ? 2 : 1,
                                           stream.device());
  rt::launch_raw(fn, cfg, stream, args);
  return out;
}

}  // namespace

int slices(const GemmGeometry& g) {
  return g.math == GemmMath::f32 && g.conv && !g.conv->weight_grad ? (g.conv->paired ? 2 : 3) : 1;
}

bool split_in_kernel(const GemmGeometry& g) {
  return g.math == GemmMath::f32 && slices(g) == 1 && !(g.conv && g.conv->paired);
}

bool stage_a_transposed(const GemmGeometry& g) {
  return tf32_mma(g.math) && g.a_mn && !g.conv && (g.batch == 1 || g.batch_a == 0) && g.lda == g.m && g.k % 4 == 0;
}

rt::DeviceBuffer transpose_a(const GemmLaunch& l, const GemmOperands& ops) {
  rt::DeviceBuffer out(static_cast<std::size_t>(l.g.m * l.g.k) * 4, *ops.stream);
  launch_nhwc(l, ops.a, out.ptr(), l.g.k, l.g.m, 1, *ops.stream);  // one image of k channels by m pixels
  return out;
}

std::int64_t staged_channels(const GemmGeometry& g) { return g.conv ? slices(g) * g.conv->c : 0; }

// Convolution modes: channel rows TMA can step (16-byte multiples), padding inside the filter,
// no prologue (A is the weights), and a geometry that says the same as its window. The weight
// gradient takes no hooks (its partials are summed after the kernel) and 16-bit inputs only
// (its tiles are MN-major).
bool conv_fits(const GemmGeometry& g) {
  const GemmConv& c = *g.conv;
  const bool wgrad = c.weight_grad;
  const bool shaped = wgrad ? g.n == c.r * c.s * c.c && g.k == g.batch * c.oh() * c.ow() && g.ldd == g.n
                            : g.n == c.oh() * c.ow() && g.k == c.r * c.s * c.c;
  if (!shaped || g.a_mn || g.b_mn || (wgrad && c.flip) || (c.k_major && !wgrad) ||
      (c.paired && g.math != GemmMath::f32) || (c.split_gy && !(wgrad && c.paired)))
    throw ValueError(
        "[gemm] convolution mode needs n = oh * ow and k = r * s * c (weight gradient: n = r * s * c = "
        "ldd, k = batch * oh * ow), operands as stored, no flip with wgrad, K-major reads only with it, "
        "paired slices only in f32 and gy split only in paired weight gradients; got " +
        g.text());
  if (c.paired && (wgrad ? !wgrad_layout(g).stage_images : c.c % 32 != 0)) return false;  // copies; a k tile a slice
  if (c.split_gy && wgrad_layout(g).row != c.ow()) return false;  // gy's rows are copied to be padded
  const auto es = static_cast<std::int64_t>(dtype_size(input_dtype(g.math)));
  if (c.oh() < 1 || c.ow() < 1 || c.pad_h < 0 || c.pad_w < 0 || c.pad_h >= c.r || c.pad_w >= c.s) return false;
  if (g.hooks.prologue || stats_of(g) == HookStats::columns || g.batch > 65535) return false;  // staging grid
  if (g.m * c.r * c.s * c.c >= (std::int64_t{1} << 31)) return false;  // the weights' copy indexes in 32 bits
  if (wgrad && (g.epilogue != GemmEpilogue::none || g.hooks.epilogue)) return false;
  if (wgrad && wgrad_layout(g).k_major) return true;  // staged to 16-byte rows where needed
  if ((c.c * es) % 16 != 0 || (wgrad && (g.m * es) % 16 != 0)) return false;
  const std::int64_t gy = wgrad ? g.m * c.oh() * c.ow() : 0;
  return g.ldd >= g.n &&
         (g.batch == 1 || (g.batch_b >= c.c * c.h * c.w && (wgrad ? g.batch_a >= gy : g.batch_d >= g.m * g.ldd)));
}

// Tiles across D's columns in the convolution modes: blocks of output rows by blocks of
// columns; in weight-gradient mode, across taps of padded channels.
std::int64_t conv_tiles_n(const GemmGeometry& g, int bn, ConvBox box) {
  if (g.conv->weight_grad) return ceil_div(g.conv->r * g.conv->s * wgrad_layout(g).channels, bn);
  return ceil_div(g.conv->oh(), box.h) * ceil_div(g.conv->ow(), box.w);
}

// Weight-gradient mode's plan: output tiles as wide as pad the taps least (MN-major ones in
// atoms of 64 columns; K-major ones a whole number of taps, or of tiles a tap), and the pixels
// split so that the tiles of every split fill the SMs about once.
std::optional<GemmLaunch> plan_wgrad(GemmLaunch l, const GemmTarget& target, GemmTile tile) {
  const GemmGeometry& g = l.g;
  const GemmConv& c = *g.conv;
  const WgradLayout w = wgrad_layout(g);
  const std::int64_t cols = c.r * c.s * w.channels;
  // Transposed tiles hold BM of dW's columns: K-major ones whole taps, or a tap in pieces.
  auto fits = [&](int bm) { return !w.k_major || w.channels % bm == 0 || bm % w.channels == 0; };
  l.transposed = tile.bm > 0 ? tile.transposed : g.m <= 32 && (fits(128) || fits(64));
  if (l.transposed) {  // tiles of dW^T: BM of its columns by its rows
    l.bm = tile.bm > 0 ? tile.bm : fits(128) ? 128 : 64;
    if (!fits(l.bm)) return std::nullopt;
    const int unit = w.k_major ? 16 : 64;  // MN-major gy comes in atoms of 64
    l.bn = static_cast<int>(std::min<std::int64_t>(ceil_div(g.m, unit) * unit, 256));
  } else {
    l.bm = tile.bm > 0 ? tile.bm : g.m <= 64 ? 64 : 128;
    l.bn = tile.bn;
  }
  if (w.k_major && !l.transposed) {  // several taps side by side share each tile of gy; the fewest padded taps, the most a tile
    const std::int64_t taps = c.r * c.s, most = w.channels == w.bn ? 256 / w.bn : 1;
    std::int64_t t = 1;
    for (std::int64_t k = 2; k <= most; ++k)
      if (ceil_div(taps, k) * k <= ceil_div(taps, t) * t) t = k;
    if (l.bn == 0) l.bn = static_cast<int>(t * w.bn);
    if (l.bn % w.bn != 0 || l.bn / w.bn > most) return std::nullopt;
  }
  if (l.bn == 0)
    for (int bn : {256, 192, 128, 64})
      if (l.bn == 0 || ceil_div(cols, bn) * bn < ceil_div(cols, l.bn) * l.bn) l.bn = bn;
  if ((l.bm != 64 && l.bm != 128) || l.bn > 256 || l.bn % (w.k_major ? 16 : 64) != 0) return std::nullopt;
  const std::int64_t per_image = ceil_div(c.oh() * w.row, 128 / static_cast<int>(dtype_size(input_dtype(g.math))));
  if (!w.k_major) l.box = wgrad_box(c);
  const std::int64_t tiles =
      l.transposed ? ceil_div(cols, l.bm) * ceil_div(g.m, l.bn) : ceil_div(g.m, l.bm) * ceil_div(cols, l.bn);
  const std::int64_t k_tiles =
      g.batch * (w.k_major ? per_image : ceil_div(c.oh(), l.box.h) * ceil_div(c.ow(), l.box.w));
  // At least 4 k tiles a split: fewer would spend more on partials than on products. Exact f32:
  // at most 64 (2048 pixels), since the MMAs' f32 sums drift as they grow (3e-5 of the largest
  // value over 4096 k, measured) and the partials are added with rounding. Among those, the
  // splits whose waves of tiles take the least time: a wave lasts its split's k tiles, each about
  // a tile's products at an SM's share of the tensor cores (the H100's and H200's), and each split
  // writes a partial that the sum reads back. Past the first 8 counts only each number of
  // waves' most splits are weighed (the fastest of that many waves, but for the partials): plans
  // are made on every call.
  const std::int64_t sms = std::max(1, target.sm_count), most = std::max<std::int64_t>(1, k_tiles / 4);
  const std::int64_t fewest = ceil_div(k_tiles, g.math == GemmMath::f32 ? 64 : k_tiles);
  const double tile_us = 2.0 * l.bm * l.bn * (128.0 / static_cast<double>(dtype_size(input_dtype(g.math)))) *
                         (g.math == GemmMath::f32 ? 3 : 1) / (tf32_mma(g.math) ? 2.5e6 : 5e6);
  const double split_us = 2.0 * static_cast<double>(g.m * cols) * 4 / 3.3e6;
  auto us = [&](std::int64_t s) {
    return static_cast<double>(ceil_div(tiles * s, sms) * ceil_div(k_tiles, s)) * tile_us +
           static_cast<double>(s) * split_us;
  };
  std::int64_t splits = fewest;
  auto weigh = [&](std::int64_t s) {
    s = ceil_div(k_tiles, ceil_div(k_tiles, s));  // every split has k tiles
    if (us(s) < us(splits)) splits = s;
  };
  for (std::int64_t s = fewest + 1; s <= std::min(most, fewest + 7); ++s) weigh(s);
  for (std::int64_t waves = 1; waves <= ceil_div(tiles * fewest, sms) + 4; ++waves)
    if (const std::int64_t s = std::min(most, waves * sms / tiles); s > fewest + 7) weigh(s);
  l.splits = static_cast<int>(splits);
  l.stages = stages_for(l, target);
  if (l.stages == 0) return std::nullopt;
  l.shared_bytes = shared_bytes(l, l.stages);
  l.grid = static_cast<int>(std::min<std::int64_t>(tiles * l.splits, std::max(1, target.sm_count)));
  return l;
}

// Weight-gradient mode and split-K: the splits' f32 partials added in order into D, [m][c][r][s]
// (split-K: one tap of n columns).
void sum_splits(const GemmLaunch& l, rt::DevicePtr parts, rt::DevicePtr d, const rt::Stream& stream) {
  const bool wgrad = l.g.conv.has_value();
  int splits = l.splits, m = static_cast<int>(l.g.m), cc = static_cast<int>(wgrad ? l.g.conv->c : l.g.n);
  int cp = static_cast<int>(wgrad ? wgrad_layout(l.g).channels : l.g.n);
  int taps = static_cast<int>(wgrad ? l.g.conv->r * l.g.conv->s : 1);
  void* args[] = {&parts, &d, &splits, &m, &cc, &cp, &taps};
  // Blocks of 128: a small result still spreads over most SMs.
  rt::LaunchConfig cfg;
  cfg.grid.x = static_cast<unsigned>(std::min<std::int64_t>(ceil_div(l.g.m * l.g.n, 128), 4096));
  cfg.block.x = 128;
  rt::launch_raw(staging_function(GemmStaging::sum_splits, output_dtype(l.g), 1, stream.device()), cfg, stream, args);
}

ConvBox conv_box(const GemmConv& c, int most) {
  const int w = static_cast<int>(std::min<std::int64_t>(c.ow(), most));
  const std::int64_t rows = std::min<std::int64_t>(c.oh(), most / w), blocks = ceil_div(c.oh(), rows);
  return {w, static_cast<int>(ceil_div(c.oh(), blocks))};
}

ConvBox wgrad_box(const GemmConv& c) {
  ConvBox best{64, 1};
  std::int64_t least = -1;
  for (int w = 64; w >= 1; w /= 2) {
    const std::int64_t padded = ceil_div(c.ow(), w) * w * ceil_div(c.oh(), 64 / w) * (64 / w);
    if (least < 0 || padded < least) least = padded, best = {w, 64 / w};
  }
  return best;
}

WgradLayout wgrad_layout(const GemmGeometry& g) {
  WgradLayout w;
  if (!g.conv || !g.conv->weight_grad) return w;
  const GemmConv& c = *g.conv;
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(input_dtype(g.math)));
  const bool as_stored = c.r == 1 && c.s == 1 && c.pad_h == 0 && c.pad_w == 0 && (c.oh() * c.ow() * es) % 16 == 0;
  w.k_major = tf32_mma(g.math) || as_stored || c.k_major;
  if (!w.k_major) {
    w.channels = ceil_div(c.c, 64) * 64;
    return w;
  }
  w.row = as_stored ? c.ow() : ceil_div(c.ow() * es, 16) * 16 / es;
  w.rows = as_stored ? c.oh() : c.oh() + c.r - 1;
  w.stage_images = !as_stored;
  w.stage_gy = w.row != c.ow() || (c.paired && !c.split_gy);  // paired: gy's hi and lo copies
  const std::int64_t tiles = ceil_div(c.c, 256);  // per tap
  w.bn = static_cast<int>(ceil_div(ceil_div(c.c, tiles), 16) * 16);
  w.channels = w.bn * tiles;
  return w;
}

ConvStaging stage_conv(const GemmLaunch& l, const GemmOperands& ops) {
  const DType t = input_dtype(l.g.math);
  const int box_k = static_cast<int>(128 / dtype_size(t));
  const std::optional<GemmConv>& c = l.g.conv;
  const WgradLayout wgrad = wgrad_layout(l.g);
  ConvStaging s;
  if (wgrad.k_major) {  // gy (m x oh*row) and the images' copies (c x rows*row), image after image
    const std::int64_t b = l.g.batch, plane = wgrad.rows * wgrad.row, gy_plane = c->oh() * wgrad.row;
    // Paired f32 slices: gy's lo copy as b more images (none where the kernel splits gy), the
    // images' lo copies as s more copies.
    const std::int64_t pairs = c->paired ? 2 : 1, gy_pairs = c->paired && !c->split_gy ? 2 : 1;
    if (c->paired) {  // cleared before the copies set it
      s.odd = rt::DeviceBuffer(4, *ops.stream);
      rt::memset_device(s.odd.ptr(), 0, 4, *ops.stream);
    }
    rt::DevicePtr gy = ops.a, x = ops.b;
    std::int64_t gy_image = l.g.batch_a, x_image = l.g.batch_b;  // as stored, or dense copies
    if (wgrad.stage_gy) {
      s.grads = std::make_shared<const rt::DeviceBuffer>(shift_rows(
          l, ops.a, l.g.m, l.g.batch_a, {c->oh(), c->ow(), c->oh(), wgrad.row, 1, 0, 0}, *ops.stream, s.odd.ptr()));
      gy = s.grads->ptr(), gy_image = l.g.m * gy_plane;
    }
    if (wgrad.stage_images) {
      s.images = std::make_shared<const rt::DeviceBuffer>(
          shift_rows(l, ops.b, c->c, l.g.batch_b, {c->h, c->w, wgrad.rows, wgrad.row, c->s, c->pad_h, c->pad_w},
                     *ops.stream, s.odd.ptr()));
      x = s.images->ptr(), x_image = c->c * plane;
    }
    // Transposed tiles take gy as B (BN rows) and the taps as A (BM columns of dW).
    const int gy_rows = l.transposed ? l.bn : l.bm, tap_cols = l.transposed ? l.bm : l.bn;
    s.map_a = rt::tiled_tensor_map_128b(gy, t, l.g.m, gy_plane, gy_plane, gy_rows, box_k, gy_pairs * b,
                                        gy_pairs * b > 1 ? gy_image : 0);
    s.map_b = rt::tiled_tensor_map_nd(
        x, t, std::array{plane, c->c, b, pairs * (wgrad.stage_images ? c->s : 1)},
        std::array{plane, std::max(x_image, c->c * plane), b * c->c * plane},
        std::array{box_k, static_cast<int>(std::min<std::int64_t>(tap_cols, wgrad.channels)), 1, 1});
  } else if (c->weight_grad) {
    const std::int64_t pixels = c->oh() * c->ow();
    s.grads = stage_nhwc(l, ops.a, l.g.m, pixels, l.g.batch_a, *ops.stream);
    s.images = stage_nhwc(l, ops.b, c->c, c->h * c->w, l.g.batch_b, *ops.stream);
    const std::array box{64, l.box.w, l.box.h, 1};
    s.map_a = rt::tiled_tensor_map_nd(s.grads->ptr(), t, std::array{l.g.m, c->ow(), c->oh(), l.g.batch},
                                      std::array{l.g.m, c->ow() * l.g.m, pixels * l.g.m}, box);
    s.map_b = rt::tiled_tensor_map_nd(s.images->ptr(), t, std::array{c->c, c->w, c->h, l.g.batch},
                                      std::array{c->c, c->w * c->c, c->h * c->w * c->c}, box);
  } else {
    if (c->paired) {  // cleared before the staging kernels set it
      s.odd = rt::DeviceBuffer(4, *ops.stream);
      rt::memset_device(s.odd.ptr(), 0, 4, *ops.stream);
    }
    s.weights = reorder_weights(l, ops, s.odd.ptr());
    s.images = stage_nhwc(l, ops.b, c->c, c->h * c->w, l.g.batch_b, *ops.stream, s.odd.ptr());
    const ConvBox box = l.box;
    const std::int64_t taps = c->r * c->s, ch = staged_channels(l.g);
    s.map_a = rt::tiled_tensor_map_nd(s.weights->ptr(), t, std::array{ch, taps, l.g.m}, std::array{ch, taps * ch},
                                      std::array{box_k, 1, l.transposed ? l.bn : l.bm});
    s.map_b = rt::tiled_tensor_map_nd(s.images->ptr(), t, std::array{ch, c->w, c->h, l.g.batch},
                                      std::array{ch, c->w * ch, c->h * c->w * ch}, std::array{box_k, box.w, box.h, 1});
  }
  return s;
}

}  // namespace kiln::kernels
