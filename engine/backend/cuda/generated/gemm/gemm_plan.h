#pragma once
// The generated GEMM kernels (kernel_templates/gemm_*.cu): for each of `batch` problems,
// D (m x n, row stride ldd) = A (m x k) @ B (n x k)^T with f32 sums, a prologue on A and an
// epilogue on each sum before it is stored (gemm_hooks.h). A and B are K-major (stored m x k and
// n x k, row strides lda and ldb) or, for 16-bit inputs, MN-major (stored k x m and k x n): so
// every transpose is a layout, never a copy. TF32 takes an MN-major B too, in tiles of D^T that
// read B's rows into registers (TF32 MMAs read only K-major tiles from shared memory; no hooks).
// plan() gives a kind's launch for a problem, or none where the kind does not apply; source()
// builds the module a launch runs and launch() runs it. Every kernel is instantiated per exact
// shape.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gemm_hooks.h"
#include "kiln/dtype.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/generated_kernels.h"
#include "kiln/runtime/memory.h"

namespace kiln::kernels {

// The arithmetic: 16-bit inputs, or f32 inputs on the TF32 tensor cores. `f32` keeps f32's
// precision on them: each operand is split into a TF32 high part and its remainder, and the
// sum adds three TF32 products, hi*hi + lo*hi + hi*lo. Convolution mode stages the split
// operands (its channels as slices, GemmConv::paired); elsewhere the kernel splits each stage's
// tiles in shared memory.
enum class GemmMath { bf16 = 0, f16 = 1, tf32 = 2, f32 = 3 };
const char* math_name(GemmMath m);  // "bf16", "f16", "tf32", "f32"
DType input_dtype(GemmMath m);      // bf16, f16, f32, f32
bool tf32_mma(GemmMath m);          // tf32 and f32: the MMAs read TF32

// What happens to a sum before it is stored: nothing, + bias[column], or + bias then ReLU
// (NaN kept, as relu keeps it). The bias has D's dtype.
enum class GemmEpilogue { none = 0, bias = 1, relu_bias = 2 };
const char* epilogue_name(GemmEpilogue e);  // "none", "bias", "relu_bias"

// Convolution mode: an implicit GEMM of stride 1 over NCHW images. For image z of the batch
// (batch_b elements apart), D (m x oh*ow, rows ldd apart) = the weights (m x r*s*c) @ the
// image's c x h x w patches, padded by zeros. Each launch stages the images NHWC and the weights
// as [m][r][s][c] on the GPU, so both operands are K-major (TF32 too). The weights come as
// stored, [m][c][r][s]; with `flip` they are [c][m][r][s] and are transposed with their taps
// reversed, as the input gradient reads them. With f32 math the staged channels are slices of
// c (GemmMath): [hi | lo] when `paired`, else [hi | lo | hf] for the images and [hi | hf | lo]
// for the weights (hf: hi with inf and NaN as 0).
//
// With `weight_grad` it is the weight gradient instead: A is gy (m x oh*ow per image, NCHW),
// B the images, and D (m x r*s*c, [m][c][r][s] with ldd = c*r*s) sums over every image, so
// n = r * s * c and k = batch * oh * ow. The launch splits the pixels among `splits` problems
// and adds their f32 partials in a fixed order; WgradLayout says how it reads gy and the images.
struct GemmConv {
  std::int64_t c = 0, h = 0, w = 0, r = 1, s = 1, pad_h = 0, pad_w = 0;
  bool flip = false, weight_grad = false;
  // 16-bit weight gradients: read K-major through the per-launch copies TF32 reads (WgradLayout)
  // instead of staged NHWC; which is faster depends on the shape, so the tuner times both.
  bool k_major = false;
  // f32 math with the split staged as hi and lo, whose tiles of one k tile a stage loads together:
  // in convolution mode with c a multiple of 32 (a k tile), so the images are read twice a tap
  // instead of three times; in a K-major weight gradient whose images are copied, through hi and
  // lo copies, so the kernel does not split its tiles in shared memory.
  bool paired = false;
  // Paired weight gradients whose gy rows need no padding: gy read as stored, each stage's gy
  // tile split by the kernel into its lo slot, instead of copied as hi and lo.
  bool split_gy = false;
  // A 16-bit weight gradient summed into f32 D instead of D in the inputs' dtype: only the
  // splits' sum writes D, so the tile kernel's module is the same.
  bool f32_out = false;
  std::int64_t oh() const { return h + 2 * pad_h - r + 1; }
  std::int64_t ow() const { return w + 2 * pad_w - s + 1; }
};

// One problem, listed once: its key words and its text.
struct GemmGeometry {
  std::int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldd = 0;
  GemmMath math = GemmMath::bf16;
  GemmEpilogue epilogue = GemmEpilogue::none;
  bool a_mn = false, b_mn = false;  // stored k x m / k x n (MN-major) instead of m x k / n x k
  // Problems side by side: elements from one problem's A, B and D to the next's.
  std::int64_t batch = 1, batch_a = 0, batch_b = 0, batch_d = 0;
  GemmHooks hooks{};  // with epilogue == none: a built-in epilogue excludes an epilogue hook
  std::optional<GemmConv> conv{};  // as GemmConv says; A and B as the caller stores them (not MN-major)
  void add_to(rt::GeneratedKey& key) const;
  // "m n k lda ldb ldd math epilogue [A^T] [B^T] [batch N a b d] [conv c h w r s ph pw [flip|wgrad
  // [K] [P] [G]]] [hooks:digest]": the tuner's problem text.
  std::string text() const;
};

// The hooks the kernel runs: g.hooks, with a built-in epilogue as a hook whose first input is the bias.
GemmHooks hooks_of(const GemmGeometry& g);
DType output_dtype(const GemmGeometry& g);  // the epilogue hook's `out`, or the inputs' dtype

// The limits a plan is made for.
struct GemmTarget {
  int arch = 90;
  int sm_count = 132;
  int max_shared = 227 * 1024;  // bytes per block after opting in
};
GemmTarget gemm_target(int device);  // the limits of a device

// The operands as device pointers on one device: A and B of the math's dtype, D of
// output_dtype, the bias of a built-in epilogue (D's dtype), the hooks' inputs in their order
// and, for an epilogue taking statistics, stats_shape(l).floats() f32s.
struct GemmOperands {
  rt::DevicePtr a = 0, b = 0, d = 0, bias = 0;
  const rt::Stream* stream = nullptr;
  std::array<rt::DevicePtr, kMaxHookInputs> epilogue_inputs{}, prologue_inputs{};
  rt::DevicePtr stats = 0;
  rt::DevicePtr totals = 0;  // with stats: their per-channel totals (2, channels) in f64, or 0
};

enum class GemmKernel {
  wgmma = 0,     // sm_90a: TMA loads, warpgroup MMA, producer/consumer warpgroups, persistent (gemm_wgmma.cu)
  mma_sync = 1,  // sm_80+: multistage cp.async, ldmatrix fragments, mma.sync; plain products only (gemm_mma.cu)
  ffma = 2,      // any arch: CUDA cores (exact f32, 16-bit), k split with the sums in the kernel (gemm_ffma.cu)
  rowdot = 3,    // any arch: D of at most 32 columns, a warp per row summing all of k (gemm_rowdot.cu)
};
const char* kernel_name(GemmKernel k);  // "wgmma", "mma", "ffma", "rowdot"

// What the tuner varies beside the heuristic's choice (0: the heuristic's). In convolution
// mode bn bounds the output pixels of a tile (the plan rounds the box up to 16 columns).
struct GemmTile {
  int bm = 0, bn = 0;
  int splits = 0;  // a plain product's k split this many ways (0 or 1: not split)
  // The convolution modes: tiles of D^T, whose rows are D's columns (output pixels, or taps of
  // channels) and whose columns its rows (bn chosen by the plan), for D of few rows, which
  // would leave a 64-row MMA mostly empty. No hooks.
  bool transposed = false;
  // The ffma kind on sm_90: a split tile's blocks as one thread-block cluster (2 to 8 splits),
  // their partials added through distributed shared memory.
  bool cluster = false;
  std::string text() const;  // "", "128x256", "128x64 k8", "128x0 T", "64x64 k8 C"
};

// Convolution mode's output pixels per tile, and weight-gradient mode's per k tile: BOX_H rows
// of BOX_W columns.
struct ConvBox {
  int w = 1, h = 1;
};

struct GemmLaunch {
  GemmKernel kernel = GemmKernel::wgmma;
  GemmGeometry g{};
  int bm = 128, bn = 128, stages = 4, group_m = 8, grid = 1;
  ConvBox box{};  // convolution modes
  // Weight-gradient mode: problems the pixels are split among; a plain product (one problem,
  // no hooks, dense D): ways its k is split, the f32 partials summed after the kernel (by the
  // kernel's last block of a tile in the ffma kind).
  int splits = 1;
  bool transposed = false;  // as GemmTile says
  bool cluster = false;     // as GemmTile says
  std::int64_t shared_bytes = 0;
  // "wgmma 128x256 s4", "wgmma 128x64 s6 k8", "wgmma 128x32 s8 T", "ffma 64x64 s4 k8 C" (a
  // cluster), "wgmma 64x32 s6 k4 K" (a 16-bit weight gradient read K-major; " P": f32 through hi
  // and lo copies, " G" gy split in the kernel): what the tuner remembers
  std::string text() const;
};

// The launch of kind `k` for problem `g`, or none where the kind does not apply (another arch,
// operands TMA cannot read: a row stride that is not a multiple of 16 bytes). ValueError for
// hooks that are malformed (hook_problem) or do not fit the problem.
std::optional<GemmLaunch> plan(GemmKernel k, const GemmGeometry& g, const GemmTarget& target, GemmTile tile = {});
// The statistics partials an epilogue hook with stats writes under launch `l`.
GemmStatsShape stats_shape(const GemmLaunch& l);
// Whether the pointers of `ops` suit the launch (TMA needs 16-byte aligned bases; every hook
// input, the bias and the statistics given).
bool operands_fit(const GemmLaunch& l, const GemmOperands& ops);
// Tiles worth timing beside the heuristic's launch `h` (not listed).
std::vector<GemmTile> alternatives(const GemmLaunch& h, const GemmTarget& target);

// Whether a launch splits a plain product's k with its partials summed by a second kernel (the
// ffma kind sums its own).
bool split_k(const GemmLaunch& l);
// The module's source; lets tests compile every configuration without a GPU.
std::string source(const GemmLaunch& l);
std::vector<std::string> entry_points(const GemmLaunch& l);
// Convolution mode's box for tiles of at most `most` output pixels: whole output rows where one
// fits (as many as the tile holds, balanced so the last block of rows is not left short),
// else a row in pieces of `most`.
ConvBox conv_box(const GemmConv& c, int most);
// Weight-gradient mode's box of 64 output pixels: the shape that pads the image least.
ConvBox wgrad_box(const GemmConv& c);
// How weight-gradient mode reads its operands.
//   - K-major (TF32 and f32 always; 16-bit where both are read as stored, or where GemmConv::k_major
//     asks): k runs over image rows of
//     `row` pixels. gy's rows are padded from ow to `row` (a copy where they differ); the
//     images are copied once per filter column s, shifted by s - pad_w and framed by pad_h zero
//     rows, so tap (r, s) reads its copy r * row pixels on from where gy is read. A 1x1 window
//     without padding whose images are 16-byte multiples reads both as stored, no copies.
//   - Otherwise (16-bit): both staged NHWC and read MN-major in boxes of 64 pixels.
struct WgradLayout {
  bool k_major = false;
  bool stage_gy = false, stage_images = false;  // K-major: copies made per launch
  std::int64_t row = 0;       // K-major: pixels per row as read (ow, padded)
  std::int64_t rows = 0;      // K-major: rows per image copy (oh + r - 1, or oh)
  std::int64_t channels = 0;  // columns per tap as the kernel lays them out (c, padded)
  int bn = 0;                 // K-major: the tile width (a whole number of tiles per tap)
};
WgradLayout wgrad_layout(const GemmGeometry& g);
// Enqueues the launch on ops.stream. ValueError when operands_fit is false.
void launch(const GemmLaunch& l, const GemmOperands& ops);

// The softmax cross-entropy over the rows of a row-kind product's D (the logits), as
// kernels::launch_cross_entropy takes it: labels (i64, one a row), the loss `out` in `loss`,
// `rows` scratch for sum and mean, stats (each row's lse, then the count) and, when given,
// unit_dx (the logits' gradient for a loss gradient of 1); with unit_dx, when given, masked_dx
// (M x K, dense): A's gradient through the product for that unit gradient, zero where A is not
// > 0 (A a ReLU's output), as launch_rowdot_input_grad writes it.
struct RowCrossEntropy {
  DType loss = DType::f32;
  rt::DevicePtr labels = 0, out = 0, rows = 0, stats = 0, unit_dx = 0;
  int reduction = 2;  // 0 none, 1 sum, 2 mean
  double smoothing = 0;
  std::int64_t ignore = 0;
  bool has_ignore = false;
  rt::DevicePtr masked_dx = 0;
};
// Whether the fused kernel's masked_dx is cheap: a lane takes one slice of k (16 bytes, or one
// element, each of 32 lanes). Longer rows lengthen the loss's kernel, which the weight gradients'
// stream waits for: on an H200 the mlp's step at batch 128 (k = 512) took 1.2 (f32) and 1.5 (bf16)
// us longer with it, where the speedrun's (k = 256 in bf16: one slice) lost a kernel.
bool rowdot_masked_dx_in_one_slice(const GemmLaunch& l);
// Whether launch_rowdot_cross_entropy takes l: the row kind with dense D (rows of n) and no ReLU.
bool rowdot_cross_entropy_fits(const GemmLaunch& l);
// l's product and the cross-entropy of D's rows in one kernel, the same bits as the product's
// kernel and then launch_cross_entropy (at a warp a row). ValueError where l does not fit.
void launch_rowdot_cross_entropy(const GemmLaunch& l, const GemmOperands& ops, const RowCrossEntropy& ce);
// Loads that kernel on `device` (compiling it where the caches lack it; a shape-only pass plans
// it), so that a capture, which cannot load a module, may launch it.
void load_rowdot_cross_entropy(const GemmLaunch& l, DType loss, int device);
// Whether it is loaded on `device`.
bool rowdot_cross_entropy_loaded(const GemmLaunch& l, DType loss, int device);
// That kernel's module source for a loss of dtype `loss` (tests compile it without a GPU).
std::string rowdot_cross_entropy_source(const GemmLaunch& l, DType loss);

// The input gradient of a row-kind product masked for the ReLU that made A: dx (m x k, dense) =
// g (m x n, dense) @ w (n x k, dense) where y (m x k, dense) > 0, else 0, a warp a row summing over
// n in order (the bits the fused cross-entropy's masked_dx has). For f32, bf16 and f16 with
// n <= 32; none elsewhere.
std::optional<GemmLaunch> plan_rowdot_input_grad(DType t, std::int64_t m, std::int64_t n, std::int64_t k,
                                                 const GemmTarget& target);
std::string rowdot_input_grad_source(const GemmLaunch& l);
void launch_rowdot_input_grad(const GemmLaunch& l, rt::DevicePtr g, rt::DevicePtr w, rt::DevicePtr y, rt::DevicePtr dx,
                              const rt::Stream& s);

}  // namespace kiln::kernels
