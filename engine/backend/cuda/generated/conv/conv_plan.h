#pragma once
// The generated convolution kernels (kernel_templates/conv_*.cu), one enum of kinds: plan()
// gives a kind's launch for a problem, or none where the kind does not apply; source() builds
// the module a launch runs, and launch() runs it. Every kernel is instantiated per exact shape.
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "conv_geometry.h"

namespace kiln::kernels {

enum class ConvKernel {
  igemm = 0,        // implicit GEMM, any pass: tensor-core MMA, or exact-f32 FFMA (conv_igemm.cu, conv_ffma.cu)
  patch = 1,        // stride-1 forward and input gradient from input patches in shared memory (conv_patch.cu)
  wgrad = 2,        // stride-1 weight gradient from staged gy and input rows (conv_wgrad.cu)
  wgrad_small = 3,  // weight gradient of at most 256 kernel rows (conv_wgrad_small.cu, conv_wgrad_small_mma.cu)
  direct = 4,       // stride-1 forward and input gradient over few channels (conv_direct.cu, conv_direct_mma.cu)
};
const char* kernel_name(ConvKernel k);  // "igemm", "patch", "wgrad", "wgrad_small", "direct"

// What the tuner varies beside a kind's heuristic (0: the heuristic's): igemm's block tile,
// patch's band of output rows.
struct ConvTile {
  int bm = 0, bn = 0, rows = 0;
  std::string text() const;  // "", "64x32", "rows 4"
};

struct IgemmPlan {
  std::int64_t gm = 0, gn = 0, gk = 0;  // the GEMM: rows, columns, summed length
  int bm = 0, bn = 0, bk = 0, splitk = 1;
  std::int64_t grid_m = 0, grid_n = 0;
  std::int64_t tiles() const { return grid_m * grid_n; }
};

// The forward conv a patch or direct kernel runs: for the input gradient gy in, dx out, padding
// mirrored.
struct PatchConv {
  std::int64_t n, ci, h, w, co, kh, kw, oh, ow, ph, pw, dh, dw, g;
};
// With `totals`, a forward that also sums its output's channels (conv_patch.cu's STATS); with
// `pool_sums`, an input gradient that also parks the sums of the pooled batch norm reading it
// (POOL_SUMS; its x is pool_h x pool_w, its parameters in pool_p, copied pool_copy bytes at a time).
struct PatchPlan {
  PatchConv conv{};
  int rows = 1, bn = 32;
  std::int64_t bands = 1, smem = 0, channel_run = 0;
  // A forward's: the channel run of its input gradient's patch conv (0 where none plans), whose
  // flipped weights its blocks also write under a ConvForBackward of the weights.
  std::int64_t flipped_run = 0;
  bool totals = false, pool_sums = false;
  DType pool_p = DType::f32;
  std::int64_t pool_h = 0, pool_w = 0, pool_copy = 0;  // pool_copy: bytes a copy of x takes
};

struct WgradPlan {
  int bc = 32;
  std::int64_t ipb = 1, groups_of_images = 1, o_tiles = 1, c_tiles = 1, smem = 0;
};

// Each block: `ipb` images' band of `rows` output rows, their gy staged `gy_stride` elements a
// channel; `bands` bands an image. `mma`: on tensor cores (conv_wgrad_small_mma.cu), its warps
// taking runs of the tap tiles where `split_taps`, else the k steps in turn. `f32_out`: 16-bit
// operands' sums written in f32.
struct SmallWgradPlan {
  std::int64_t ipb = 1, bands = 1, rows = 1, gy_stride = 1, blocks = 1, smem = 0;
  bool mma = false, split_taps = false, f32_out = false;
};

// Each thread: ot output channels at p neighbouring pixels; each block: a band of `rows` output
// rows of one image, `threads` threads. `mma`: on tensor cores (conv_direct_mma.cu; ot and p
// unused). With `totals`, a forward that also sums its output's channels (STATS).
struct DirectPlan {
  PatchConv conv{};
  int ot = 8, p = 4, rows = 1, threads = 32;
  std::int64_t bands = 1, smem = 0;
  bool mma = false, totals = false;
};

struct ConvLaunch {
  ConvKernel kernel = ConvKernel::igemm;
  ConvPass pass = ConvPass::forward;
  ConvGeometry g{};
  DType dtype = DType::f32;
  ConvMath math = ConvMath::f32;
  std::variant<IgemmPlan, PatchPlan, WgradPlan, SmallWgradPlan, DirectPlan> plan;
};

// The launch of kernel kind `k` for this problem and dtype (a, b and out of one dtype), or
// none where the kind does not apply.
std::optional<ConvLaunch> plan(ConvKernel k, ConvPass pass, const ConvGeometry& g, DType t, ConvMath math,
                               const ConvTarget& target, ConvTile tile = {});
// The launch also taking its output's per-channel statistics (ConvOperands::totals), or none
// where its kind cannot (only the direct and patch kinds' forwards can) or they do not fit.
std::optional<ConvLaunch> with_totals(const ConvLaunch& l, const ConvTarget& target);
// The f32 partials of the statistics that the launch writes (ConvOperands::stats); 0 without.
std::int64_t stats_floats(const ConvLaunch& l);
// The input gradient also parking the sums of the pooled batch norm `s` (only the patch kind's
// can, for one group), or none.
std::optional<ConvLaunch> with_pool_sums(const ConvLaunch& l, const ConvPoolSums& s, const ConvTarget& target);
// The splits of the statistics' or the pooled sums' partials that the launch parks (its blocks
// along x); 0 where it parks none.
std::int64_t parked_splits(const ConvLaunch& l);
// Whether im2col + cuBLAS measured faster than this launch (narrow exact-f32 products), so
// that an op leaves the problem to it.
bool slower_than_fallback(const ConvLaunch& l);
// Tiles worth timing beside the heuristic's launch `h` (not listed).
std::vector<ConvTile> alternatives(const ConvLaunch& h, const ConvTarget& target);

// The module's source; lets tests compile every configuration without a GPU.
std::string source(const ConvLaunch& l);
// The module's entry points, the kernel first.
std::vector<std::string> entry_points(const ConvLaunch& l);
// Enqueues the launch on ops.stream (workspaces from the stream's pool, freed in stream order).
void launch(const ConvLaunch& l, const ConvOperands& ops);

}  // namespace kiln::kernels
