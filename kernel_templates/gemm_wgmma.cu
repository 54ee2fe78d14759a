#define KILN_ARCH_SPECIFIC 1
// The GEMM tile engine on sm_90a: D (M x N, row stride LDD) = A (M x K) @ B (N x K)^T for each
// of BATCH problems, then an epilogue on each f32 result before it is stored. An operand is
// K-major (its rows run along k) or, for 16-bit inputs, MN-major (stored as K rows of M or N).
// REG_A (TF32, transposed plain products): A is MN-major too, its fragments read from shared
// memory into registers, since TF32 MMAs read only K-major tiles from shared memory.
//   - TMA loads 128-byte rows of A and B into 128-byte-swizzled shared memory, STAGES deep
//     (an MN-major operand as atoms of 128 bytes of columns by BK rows);
//   - one producer warpgroup (a single thread issues the copies) and BM/64 consumer
//     warpgroups, each multiplying 64 rows by BN columns with warpgroup MMA;
//   - a stage is handed over by two mbarriers: `full` (the copies' bytes have landed) and
//     `empty` (every consumer has read it);
//   - persistent: GRID blocks walk the tiles, GROUP_M tile rows at a time so that the B
//     tiles they share stay in L2.
// Rows, columns and k past the matrices read as zeros (TMA fills them); stores are masked.
// Convolution mode (CONV): an implicit GEMM of stride 1. The images come staged NHWC
// (kiln_nchw_to_nhwc) and the weights as [o][r][s][c] (kiln_conv_weights_rsc; both in
// gemm_staging.cu, as are the other staging kernels named here), so k runs over
// (r, s, blocks of BK channels) and both operands are K-major: B's tile is one 4-D box of
// BK channels x BOX_W columns x BOX_H output rows of image z, shifted by (r - pad, s - pad).
// The shifts move outer dimensions only (TMA takes a box only where its start along the
// contiguous dimension is 16-byte aligned), and TMA fills the padding and every edge with
// zeros. Column j of a tile is output pixel (j / BOX_W, j % BOX_W) of its block; columns past
// BOX_W x BOX_H are never loaded and never stored. TRANSPOSED tiles compute D^T where D has
// few rows (channels): A is the box (rows: output pixels), B the weights (columns: channels),
// and each sum is stored at its channel's row of D; so too in weight-gradient mode's MN-major
// layouts (A: the taps' tiles, B: gy's).
// f32 math: x = hi + lo (both TF32), and the TF32 MMAs sum hi*hi + lo*hi + hi*lo, which keeps
// f32's precision. Convolution mode stages the split, since its operands are read many times
// over: PAIRED (channels a multiple of BK), both operands as slices [hi | lo] whose tiles a stage
// holds side by side, so the images are read twice a tap, not three times; otherwise (SLICES 3)
// its channels are three slices of C, images [hi | lo | hf] and weights [hi | hf | lo]. PAIRED
// K-major weight gradients read gy's and the images' copies made as hi copies then lo copies;
// with SPLIT_GY, gy as stored, each stage's gy tile split by the consumers into its lo slot.
// Elsewhere (SPLIT_F32) the consumers split each stage's f32 tiles in shared memory (hi in
// place, lo in tiles of their own; A in registers where it is read there).
// Weight-gradient mode (CONV_MODE 2, 16-bit): D (m x r*s*C, C = channels padded to 64) =
// gy @ patches^T, k running over boxes of 64 output pixels (BOX_W x BOX_H) of every image. Both
// come staged NHWC, so both tiles are MN-major atoms of 64 channels by those 64 pixels; an atom
// of B is one tap's box of the input, shifted by (r - pad, s - pad). The k tiles are split
// BATCH ways: problem z writes its f32 partial sums, and kiln_gemm_sum_splits adds them in
// order into [m][c][r][s]. WGRAD_K_MAJOR (TF32, or a 1x1 window read as stored): k runs over
// the pixels of gy's rows padded to WGRAD_ROW, in K-major boxes of BK of one image; a B tile
// holds whole taps (or BN channels of one), each read from the images' copy for filter
// column s (shifted by s - pad_w, framed by pad_h zero rows; kiln_conv_shift_rows) r rows on.
// Hooks (gemm_hooks.h): a prologue rewrites each consumer's A rows in shared memory before its
// MMAs; the epilogue maps each sum, may add D's old value, and may leave per-row or per-column
// partial sums and squares of the stored values in `hp.stats`, which the last block to finish
// adds into per-channel totals in f64 when `hp.totals` is given (a batch norm's statistics).
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
namespace {

using In = ${IN};
using Out = ${OUT};
constexpr int kBM = ${BM}, kBN = ${BN}, kStages = ${STAGES}, kGroupM = ${GROUP_M};
constexpr int kConsumers = kBM / 64;
constexpr int kBK = 128 / sizeof(In);        // one swizzle atom: 128 bytes of k per row
constexpr int kMmaK = 32 / sizeof(In);       // k of one MMA: 32 bytes (16 halves, 8 tf32)
constexpr long long kM = ${M}, kN = ${N}, kK = ${K}, kLdd = ${LDD}, kBatchD = ${BATCH_D};
constexpr bool kAMn = ${A_MN}, kBMn = ${B_MN};
constexpr bool kABatched = ${A_BATCHED}, kBBatched = ${B_BATCHED};  // false: every problem reads the same one
constexpr int kBatch = ${BATCH};
constexpr int kConvMode = ${CONV_MODE};
constexpr bool kConv = kConvMode == 1, kWgrad = kConvMode == 2, kWgradKMajor = ${WGRAD_K_MAJOR};
// Tiles of D^T, for D of few rows (channels), which would leave a 64-row MMA mostly padding:
// a tile's rows are D's columns (output pixels; in weight-gradient mode taps of channels).
constexpr bool kTransposed = ${TRANSPOSED};
// Plain products transposed (TF32 with B MN-major): A is B's matrix, read into registers.
constexpr bool kRegA = ${REG_A};
constexpr int kRow = ${WGRAD_ROW};
constexpr int kC = ${CONV_C}, kS = ${CONV_S}, kPadH = ${CONV_PAD_H}, kPadW = ${CONV_PAD_W};
constexpr int kOH = ${CONV_OH}, kOW = ${CONV_OW}, kBoxH = ${BOX_H}, kBoxW = ${BOX_W}, kRS = ${CONV_RS};
constexpr bool kPaired = ${PAIRED}, kSplitGy = ${SPLIT_GY};
constexpr int kSliceC = kPaired && kConv ? kC / 2 : kC;  // PAIRED: the lo slice's channels follow the hi's
constexpr int kCBlocks = (kSliceC + kBK - 1) / kBK;  // k tiles per filter tap
constexpr int kTilesW = kConv ? (kOW + kBoxW - 1) / kBoxW : 1;
// Weight-gradient mode: k tiles are boxes of output pixels, image by image, split BATCH ways.
constexpr int kImages = ${CONV_IMAGES}, kPixTilesW = (kOW + kBoxW - 1) / kBoxW;
constexpr int kPixTiles = kWgradKMajor ? (kOH * kRow + kBK - 1) / kBK : (kOH + kBoxH - 1) / kBoxH * kPixTilesW;
// SPLIT_K (one plain problem, no hooks): the k tiles split BATCH ways, partials summed after.
constexpr bool kSplitK = ${SPLIT_K};
constexpr long long kWgradK = static_cast<long long>(kImages) * kPixTiles;
constexpr int kPixelTiles = (kOH + kBoxH - 1) / kBoxH * kTilesW;
constexpr int kRowsTile = kTransposed ? kBN : kBM, kColumnsTile = kTransposed ? kBM : kBN;  // of D
constexpr int kTilesOfRows = (kM + kRowsTile - 1) / kRowsTile;
constexpr int kTilesOfColumns = kConv ? kPixelTiles : (kN + kColumnsTile - 1) / kColumnsTile;
constexpr int kTilesM = kTransposed ? kTilesOfColumns : kTilesOfRows;
constexpr int kTilesN = kTransposed ? kTilesOfRows : kTilesOfColumns;
constexpr int kTilesPerBatch = kTilesM * kTilesN, kTiles = kBatch * kTilesPerBatch;
// Shared-memory descriptors: an MN-major tile's 64-column atoms lie BK rows (of 128 bytes)
// apart; a k step of one MMA moves 32 bytes along a K-major row, or 16 rows down an MN-major one.
constexpr unsigned kAtomBytes = kBK * 128;
constexpr int kAtomCols = 128 / sizeof(In);  // columns of an MN-major atom
constexpr unsigned kStepA = kAMn ? 16 * 128 : 32, kStepB = kBMn ? 16 * 128 : 32;
static_assert((!kAMn || kBK == 64 || kRegA) && (!kBMn || (kBK == 64 && kBN % 64 == 0)),
              "MN-major tiles: 16-bit, 64-column atoms (TF32: A, in registers)");
static_assert(!kRegA || (kAMn && sizeof(In) == 4 && kTransposed && kConvMode == 0),
              "A in registers: TF32, MN-major, plain products transposed");
constexpr int kKTiles = kConv ? kRS * kCBlocks : (kK + kBK - 1) / kBK;
constexpr unsigned kBytesA = kBM * 128, kBytesB = kBN * 128, kStageBytes = kBytesA + kBytesB;
// The bytes a stage's copies bring: in convolution mode the box may fill fewer rows than its tile.
constexpr unsigned kBoxBytes = kBoxW * kBoxH * 128;
constexpr unsigned kLoadedA = kConv && kTransposed ? kBoxBytes : kBytesA, kLoadedB = kConv && !kTransposed ? kBoxBytes : kBytesB;
constexpr unsigned kLoadBytes = kLoadedA + kLoadedB;
// SPLIT_GY: gy's lo is not loaded (transposed tiles hold gy as B) but split in shared memory.
constexpr unsigned kGyBytes = kSplitGy ? (kTransposed ? kLoadedB : kLoadedA) : 0;
constexpr bool kSplitF32 = ${SPLIT_F32};
// REG_A with SPLIT_F32: a k tile's B split and A fragments loaded while the previous tile's MMAs
// run, which keeps their hi, lo and hf registers live across the loop (only up to 128 columns,
// where the accumulators leave room).
constexpr bool kOverlapRegA = kRegA && kSplitF32 && kBN <= 128;
// SPLIT_F32: the lo tiles, two sets past the stages (A's only where A is not in registers), so
// that a k tile is split while the previous one's MMAs run.
constexpr unsigned kLoBytesA = kSplitF32 && !kRegA ? kBytesA : 0, kLoBytes = kSplitF32 ? kLoBytesA + kBytesB : 0;
// The lo tiles past the stages: SPLIT_F32's two sets, or PAIRED's one a stage (A's, then B's).
constexpr unsigned kLoRegion = kPaired ? kStages * kStageBytes : 2 * kLoBytes;
static_assert(!kPaired || (((kConv && kSliceC % kBK == 0) || (kWgrad && kWgradKMajor)) && !kSplitF32 && sizeof(In) == 4),
              "paired slices: f32 math, convolution mode's in whole k tiles of a slice, or K-major weight gradients");
static_assert(!kSplitGy || (kPaired && kWgrad), "gy split in the kernel: paired weight gradients");
static_assert(!kConv || (!kAMn && !kBMn && kBoxW * kBoxH <= (kTransposed ? kBM : kBN)),
              "convolution mode: K-major operands, one box per tile");
// K-major weight gradients: a tile of taps (B, or A when transposed) is boxes of kTapRows, each
// of one tap's channels.
constexpr int kTapRows = kC < kColumnsTile ? kC : kColumnsTile;
static_assert(!kWgrad || (kWgradKMajor ? !kAMn && !kBMn && kColumnsTile % kTapRows == 0 && kC % kTapRows == 0
                                       : kAMn && kBMn && kBoxW * kBoxH == kBK && kC % 64 == 0),
              "weight-gradient mode: K-major tiles of whole taps or within one, or MN-major 64-pixel boxes");
${HOOK_CONSTANTS}
static_assert(!kTransposed || ((kConv || kWgrad || kRegA) && !kPrologue && !kAccumulate && kStats != 2),
              "transposed tiles: the convolution modes or A in registers, no hooks but D's row statistics");
// Statistics partials: per row, one per problem and column of tiles; per column, one per
// problem and consumer's 64 rows. Transposed tiles hold D's rows as their columns: their row
// statistics are their columns' sums (column_stats), one per problem, tile and consumer.
constexpr bool kColumnSums = kStats == 2 || (kStats == 1 && kTransposed);
constexpr long long kStatsParts = kColumnSums ? (long long)kBatch * kTilesM * kConsumers : (long long)kBatch * kTilesN;
constexpr long long kStatsChannels = kStats == 1 ? kM : kN;
// Where one tile spans every channel, a CTA adds its tiles' sums in registers, in its tiles'
// order, and parks one partial (one a consumer for column sums): fewer for the totals to add.
constexpr bool kStatsPerCta = kStats != 0 && (kColumnSums ? kTilesN == 1 : kTilesM == 1);
__device__ __forceinline__ long long stats_parts() {
  return kStatsPerCta ? static_cast<long long>(gridDim.x) * (kColumnSums ? kConsumers : 1) : kStatsParts;
}
// A thread's running sums and squares over its CTA's tiles (kStatsPerCta): its two rows, or its
// columns tid and tid + 128.
struct StatsRun {
  float s[2] = {0.f, 0.f}, q[2] = {0.f, 0.f};
};

// The hooks' operands, as the host lays them out.
struct HookPointers {
  const void* epi[6];
  const void* pro[6];
  float* stats;
  double* totals;       // null: the partials alone
  const unsigned* odd;  // PAIRED: nonzero where the staging met inf or NaN in either operand
};

template <class T>
__device__ __forceinline__ float hook_load(const void* p, long long i) {
  return kiln::cvt<float>(static_cast<const T*>(p)[i]);
}

${HOOK_FUNCTIONS}

struct alignas(64) TensorMap {
  unsigned long long words[16];
};

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void bar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}

__device__ __forceinline__ void bar_expect_bytes(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void bar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// Waits until the phase of parity `parity` has completed (a fresh barrier counts its phase
// before the first as completed, so waiting on parity 1 there returns at once).
__device__ __forceinline__ void bar_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// The box at (x, y) of problem z: x counts along the stored rows, y rows.
__device__ __forceinline__ void tma_load(unsigned dst, const TensorMap* map, unsigned bar, int x, int y, int z) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(
          dst),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(bar), "r"(x), "r"(y), "r"(z)
      : "memory");
}

__device__ __forceinline__ void tma_load_4d(unsigned dst, const TensorMap* map, unsigned bar, int x, int y, int w, int z) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(
          dst),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(bar), "r"(x), "r"(y), "r"(w), "r"(z)
      : "memory");
}

// Convolution mode's k tile kt of tile (z, tm, tn): the weights of tap (r, s) for BK channels,
// and the box of staged input under the tile's output pixels, shifted by the tap; both from
// channel `slice` on (PAIRED's lo slice).
__device__ __forceinline__ void load_conv_tiles(unsigned dst_a, unsigned dst_b, const TensorMap* map_a,
                                                const TensorMap* map_b, unsigned bar, int kt, int z, int tm, int tn,
                                                int slice) {
  const int rs = kt / kCBlocks, c0 = (kt % kCBlocks) * kBK + slice, r = rs / kS, s = rs % kS;
  const int box = kTransposed ? tm : tn, oh0 = (box / kTilesW) * kBoxH, ow0 = (box % kTilesW) * kBoxW;
  if constexpr (kTransposed) {
    tma_load_4d(dst_a, map_b, bar, c0, ow0 + s - kPadW, oh0 + r - kPadH, z);
    tma_load(dst_b, map_a, bar, c0, rs, tn * kBN);
  } else {
    tma_load(dst_a, map_a, bar, c0, rs, tm * kBM);
    tma_load_4d(dst_b, map_b, bar, c0, ow0 + s - kPadW, oh0 + r - kPadH, z);
  }
}

// Weight-gradient mode's k tile kt of tile (tm, tn): the box of output pixels it covers, in
// gy for each 64 rows of A and, shifted by the atom's tap, in the input for each 64 columns of B.
// PAIRED slice 1: the lo copies, gy's kImages images on and the images' kS copies on (SPLIT_GY:
// the images' only; the consumers write gy's).
__device__ __forceinline__ void load_wgrad_tiles(unsigned dst_a, unsigned dst_b, const TensorMap* map_a,
                                                 const TensorMap* map_b, unsigned bar, long long kt, int tm, int tn,
                                                 int slice) {
  const int image = static_cast<int>(kt / kPixTiles), box = static_cast<int>(kt % kPixTiles);
  // gy's tile (D's rows) and the taps' (D's columns); transposed, the taps are A.
  const unsigned dst_gy = kTransposed ? dst_b : dst_a, dst_taps = kTransposed ? dst_a : dst_b;
  const int t_gy = kTransposed ? tn : tm, t_taps = kTransposed ? tm : tn;
  if constexpr (kWgradKMajor) {
    if (!kSplitGy || slice == 0) tma_load(dst_gy, map_a, bar, box * kBK, t_gy * kRowsTile, image + slice * kImages);
#pragma unroll
    for (int j = 0; j < kColumnsTile / kTapRows; ++j) {
      const int col = t_taps * kColumnsTile + j * kTapRows, tap = col / kC;
      tma_load_4d(dst_taps + j * kTapRows * 128, map_b, bar, box * kBK + (tap / kS) * kRow, col % kC, image,
                  tap % kS + slice * kS);
    }
    return;
  }
  const int oh0 = (box / kPixTilesW) * kBoxH, ow0 = (box % kPixTilesW) * kBoxW;
#pragma unroll
  for (int j = 0; j < kRowsTile / 64; ++j)
    tma_load_4d(dst_gy + j * kAtomBytes, map_a, bar, t_gy * kRowsTile + 64 * j, ow0, oh0, image);
#pragma unroll
  for (int j = 0; j < kColumnsTile / 64; ++j) {
    const int col = t_taps * kColumnsTile + 64 * j, tap = col / kC;
    tma_load_4d(dst_taps + j * kAtomBytes, map_b, bar, col % kC, ow0 + tap % kS - kPadW, oh0 + tap / kS - kPadH, image);
  }
}

// The k tiles of problem z: all of them, or in weight-gradient mode and split-K its share.
__device__ __forceinline__ void k_range(int z, long long& first, long long& end) {
  if constexpr (kWgrad || kSplitK) {
    constexpr long long kAll = kWgrad ? kWgradK : kKTiles, kPer = (kAll + kBatch - 1) / kBatch;
    first = z * kPer;
    end = first + kPer < kAll ? first + kPer : kAll;
  } else {
    first = 0;
    end = kKTiles;
  }
}

// Column j of tile tn: its offset along a row of D, or -1 past the output.
__device__ __forceinline__ long long column_of(int tn, int j) {
  if constexpr (kConv) {
    // The epilogue's j is 8 * (a constant) + (a lane's 0..6): with boxes of whole groups of 8
    // columns, the box row is that constant's, known when the kernel is compiled.
    const int jb = kBoxW % 8 == 0 ? (j & ~7) / kBoxW : j / kBoxW;
    const int jw = kBoxW % 8 == 0 ? (j & ~7) % kBoxW + (j & 7) : j % kBoxW;
    const int oh = (tn / kTilesW) * kBoxH + jb, ow = (tn % kTilesW) * kBoxW + jw;
    return j < kBoxW * kBoxH && oh < kOH && ow < kOW ? static_cast<long long>(oh) * kOW + ow : -1;
  } else {
    const long long col = static_cast<long long>(tn) * kBN + j;
    return col < kN ? col : -1;
  }
}

// A tile of 128-byte rows, 128-byte swizzled: 8-row groups 1024 bytes apart; `lbo` bytes between
// an MN-major tile's column atoms (unused for K-major).
__device__ __forceinline__ unsigned long long smem_desc(unsigned addr, unsigned lbo) {
  return static_cast<unsigned long long>((addr & 0x3FFFF) >> 4) | (static_cast<unsigned long long>(lbo >> 4) << 16) |
         (64ull << 32) | (1ull << 62);
}

// One operand's tile for k tile kt: a K-major box of `rows` rows, or MN-major atoms side by side.
template <bool kMn, int kRows>
__device__ __forceinline__ void load_tile(unsigned dst, const TensorMap* map, unsigned bar, int kt, int row0, int z) {
  if constexpr (kMn) {
#pragma unroll
    for (int j = 0; j < kRows / kAtomCols; ++j)
      tma_load(dst + j * kAtomBytes, map, bar, row0 + kAtomCols * j, kt * kBK, z);
  } else {
    tma_load(dst, map, bar, kt * kBK, row0, z);
  }
}

${MMA}

// REG_A: consumer c's fragments of A for one k tile in `tile` (MN-major atoms of 32 TF32
// columns by BK rows, 128-byte swizzled). Register i of MMA step kk holds row
// 16*warp + lane/4 + 8*(i%2) and k 8*kk + lane%4 + 4*(i/2) of the consumer's 64 rows (each
// warp's 16 rows as an m16n8k8 TF32 A fragment).
__device__ __forceinline__ void load_a_fragments(unsigned (&a)[kBK / kMmaK][4], unsigned tile, int c, int warp,
                                                 int lane) {
#pragma unroll
  for (int kk = 0; kk < kBK / kMmaK; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int m = c * 64 + 16 * warp + lane / 4 + 8 * (i % 2), k = 8 * kk + lane % 4 + 4 * (i / 2);
      const unsigned addr = tile + (m / 32) * kAtomBytes + k * 128 + ((((m % 32) / 4) ^ (k % 8)) * 16) + (m % 4) * 4;
      asm volatile("ld.shared.b32 %0, [%1];" : "=r"(a[kk][i]) : "r"(addr) : "memory");
    }
}

// Tile t's problem and (row, column) of tiles: GROUP_M tile rows side by side, column by column.
__device__ __forceinline__ void tile_coords(int t, int& z, int& tm, int& tn) {
  z = t / kTilesPerBatch;
  t %= kTilesPerBatch;
  const int per_group = kGroupM * kTilesN, first = (t / per_group) * kGroupM;
  const int rows = kTilesM - first < kGroupM ? kTilesM - first : kGroupM, r = t % per_group;
  tm = first + r % rows;
  tn = r / rows;
}

// Two neighbouring columns of one row; one store when every pair is aligned: the column is
// even (in convolution mode, when a row of the output is) and the strides are.
constexpr bool kPairsAligned = kLdd % 2 == 0 && kBatchD % 2 == 0 && (!kConv || kOW % 2 == 0);
// Where a pair's columns lie side by side in D and exist together (an even N; in convolution
// mode even box and output widths), a pair is stored whole or not at all: one branch a pair
// instead of three, a smaller kernel and a shorter compile.
constexpr bool kPairsWhole = kConv ? kBoxW % 2 == 0 && kOW % 2 == 0 : kN % 2 == 0;
__device__ __forceinline__ void store_pair(Out* p, float v0, float v1) {
  if constexpr (kPairsAligned && sizeof(Out) == 4) {
    *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
  } else if constexpr (kPairsAligned) {
    const Out h[2] = {kiln::cvt<Out>(v0), kiln::cvt<Out>(v1)};
    unsigned u;
    memcpy(&u, h, sizeof u);
    *reinterpret_cast<unsigned*>(p) = u;
  } else {
    p[0] = kiln::cvt<Out>(v0);
    p[1] = kiln::cvt<Out>(v1);
  }
}

// Staged stores (the host's staged_stores): a warp writes its 16 rows of the tile to shared
// memory 128 bytes of columns at a time, then stores them 16 bytes a lane along D's rows, so
// that a request carries whole lines instead of one pair of columns for each of 8 rows.
constexpr bool kStagedStores = ${STAGED_STORES};
constexpr int kPiece = 16 / sizeof(Out), kLine = 128 / sizeof(Out);  // columns in 16 and 128 bytes
static_assert(!kStagedStores || (!kTransposed && !kAccumulate && kStats == 0 && kLdd % kPiece == 0 && kBatchD % kPiece == 0 &&
                                 (!kConv || (kBoxW % kPiece == 0 && kOW % kPiece == 0))),
              "staged stores: 16-byte pieces of D's rows, aligned and side by side, nothing read back, no statistics");

// The warp's rows row0 .. row0 + 15 of tile (z, tn), columns J0 .. J0 + 127 bytes' worth, from
// `acc` (see the accumulator layout in the kernel) through `buf` (16 lines of 128 bytes; a line's
// 16-byte pieces permuted by its index mod 8, so that neither the pairs written nor the pieces
// read meet in a bank), then the next 128 bytes. J0 is a template argument so that every acc
// index is known when compiled: indexed at run time, acc would live in local memory, which the
// asynchronous MMAs cannot write.
template <int J0>
__device__ __forceinline__ void store_staged(const float* acc, long long z, int tn, long long row0, int lane, unsigned buf,
                                             Out* d, const HookPointers& hp) {
  constexpr int kCols = kBN - J0 < kLine ? kBN - J0 : kLine, kPieces = kCols / kPiece;
#pragma unroll
  for (int r = J0 / 2; r < (J0 + kCols) / 2; r += 2) {  // the registers of these columns
    const int j = 8 * (r / 4) + 2 * (lane % 4), line = lane / 4 + 8 * ((r / 2) % 2);
    const long long row = row0 + line, col = column_of(tn, j);
    const long long next = kPairsWhole ? (col >= 0 ? col + 1 : -1) : column_of(tn, j + 1);
    const float v0 = row < kM && col >= 0 ? epilogue(acc[r], row, col, z, hp) : 0.f;
    const float v1 = row < kM && next >= 0 ? epilogue(acc[r + 1], row, next, z, hp) : 0.f;
    const int byte = (j - J0) * static_cast<int>(sizeof(Out));
    const unsigned addr = buf + line * 128 + (((byte / 16) ^ (line % 8)) * 16) + byte % 16;
    if constexpr (sizeof(Out) == 4) {
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(v0), "f"(v1) : "memory");
    } else {
      const Out h[2] = {kiln::cvt<Out>(v0), kiln::cvt<Out>(v1)};
      unsigned u;
      memcpy(&u, h, sizeof u);
      asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(u) : "memory");
    }
  }
  __syncwarp();
#pragma unroll
  for (int q = 0; q < 16 * 8 / 32; ++q) {  // 16 lines of 8 pieces, 4 a lane
    const int i = q * 32 + lane, line = i / 8, piece = i % 8;
    const long long row = row0 + line, col = column_of(tn, J0 + piece * kPiece);
    if (piece >= kPieces || row >= kM || col < 0) continue;
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(buf + line * 128 + ((piece ^ (line % 8)) * 16))
                 : "memory");
    Out* p = d + z * kBatchD + row * kLdd + col;
    // Pieces are whole in convolution mode (static_assert) and where they divide N.
    if (kConv || kN % kPiece == 0 || col + kPiece <= kN) {
      *reinterpret_cast<uint4*>(p) = v;
    } else if constexpr (!kConv && kN % kPiece != 0) {
      Out e[kPiece];
      memcpy(e, &v, 16);
#pragma unroll
      for (int k = 0; k < kPiece; ++k)
        if (col + k < kN) p[k] = e[k];
    }
  }
  __syncwarp();  // the next 128 bytes of columns overwrite the lines
  if constexpr (J0 + kLine < kBN) store_staged<J0 + kLine>(acc, z, tn, row0, lane, buf, d, hp);
}

// Named barrier 1 + c: consumer c's four warps only.
__device__ __forceinline__ void consumer_sync(int c) { asm volatile("bar.sync %0, 128;" ::"r"(1 + c) : "memory"); }

// SPLIT_F32 and REG_A: tf32_round, split_f32 and finite_or_zero (tf32_split.cu).
${TF32_SPLIT}

// Named barrier 3: every consumer, while the split tiles are shared; the second form also tells
// whether any of them passes `odd`.
__device__ __forceinline__ void split_sync() { asm volatile("bar.sync 3, %0;" ::"n"(kConsumers * 128) : "memory"); }
__device__ __forceinline__ bool split_sync_any(bool odd) {
  unsigned any;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbar.red.or.pred q, 3, %2, p;\nselp.u32 %0, 1, 0, q;\n}"
      : "=r"(any)
      : "r"(static_cast<unsigned>(odd)), "n"(kConsumers * 128)
      : "memory");
  return any != 0;
}

// SPLIT_F32: the `bytes` of f32 tile `tile` split by every consumer thread (id `t`), 16 bytes at a
// time: hi in place, lo at the same offset in `lo`. Returns whether this thread met a non-finite x.
template <unsigned kBytes>
__device__ __forceinline__ bool split_tile(unsigned tile, unsigned lo, int t) {
  bool odd = false;
  constexpr unsigned kStep = 16u * kConsumers * 128;
  // Unrolled 4 deep, not fully: a 256-wide tile's 16 steps cost ptxas a fifth of the kernel's
  // compile and the loop's shared-memory traffic hides its branch.
#pragma unroll 4
  for (unsigned q = 0; q < (kBytes + kStep - 1) / kStep; ++q) {
    const unsigned o = q * kStep + 16u * t;
    if (kBytes % kStep != 0 && o >= kBytes) break;
    float x[4], h[4], l[4];
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(x[0]), "=f"(x[1]), "=f"(x[2]), "=f"(x[3]) : "r"(tile + o));
#pragma unroll
    for (int i = 0; i < 4; ++i) split_f32(x[i], h[i], l[i], odd);
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(tile + o), "f"(h[0]), "f"(h[1]), "f"(h[2]), "f"(h[3]) : "memory");
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(lo + o), "f"(l[0]), "f"(l[1]), "f"(l[2]), "f"(l[3]) : "memory");
  }
  return odd;
}
// A split tile's hi where a non-finite x becomes 0 (hf), for the products with the other's lo.
template <unsigned kBytes>
__device__ __forceinline__ void finite_tile(unsigned tile, int t) {
  constexpr unsigned kStep = 16u * kConsumers * 128;
#pragma unroll 4
  for (unsigned q = 0; q < (kBytes + kStep - 1) / kStep; ++q) {
    const unsigned o = q * kStep + 16u * t;
    if (kBytes % kStep != 0 && o >= kBytes) break;
    float x[4];
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(x[0]), "=f"(x[1]), "=f"(x[2]), "=f"(x[3]) : "r"(tile + o));
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(tile + o), "f"(finite_or_zero(x[0])),
                 "f"(finite_or_zero(x[1])), "f"(finite_or_zero(x[2])), "f"(finite_or_zero(x[3]))
                 : "memory");
  }
}

// REG_A with SPLIT_F32: a fragment's hi, lo and hf (hi, or 0 where x is not finite).
__device__ __forceinline__ void split_fragment(const unsigned (&x)[4], unsigned (&h)[4], unsigned (&l)[4], unsigned (&f)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float hi, lo;
    bool odd = false;
    split_f32(__uint_as_float(x[i]), hi, lo, odd);
    h[i] = __float_as_uint(hi);
    l[i] = __float_as_uint(lo);
    f[i] = __float_as_uint(finite_or_zero(hi));
  }
}

// The prologue on consumer c's 8 KiB of A in stage memory `tile` (64 K-major rows, or one
// MN-major atom of BK rows), 16 bytes per thread at a time; the swizzle permutes each 128-byte
// line's 16-byte chunks by the line's index mod 8.
__device__ __forceinline__ void prologue_tile(unsigned tile, long long kt, long long z, int tid, const HookPointers& hp) {
  constexpr int kPer = 16 / sizeof(In);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int j = tid + 128 * q, line = j / 8, chunk = (j % 8) ^ (line % 8);
    const unsigned addr = tile + 16u * j;
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    In e[kPer];
    memcpy(e, &v, 16);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const long long k = kt * kBK + (kAMn ? line : chunk * kPer + i);
      if (k < kK) e[i] = kiln::cvt<In>(prologue(kiln::cvt<float>(e[i]), k, z, hp));
    }
    memcpy(&v, e, 16);
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
  }
  // The MMAs read shared memory through the async proxy: make these writes visible to it.
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Per-row partials of the stored values in `acc` (rows row0 and row0 + 8 of this thread; the
// four lanes of a quad hold a row's columns).
__device__ __forceinline__ void park_stats(float* stats, long long part, long long channel, float s, float q) {
  stats[part * kStatsChannels + channel] = s;
  stats[(stats_parts() + part) * kStatsChannels + channel] = q;
}

__device__ __forceinline__ void row_stats(const float* acc, long long z, int tn, long long row0, int lane, float* stats,
                                          StatsRun& run) {
  float s[2] = {0.f, 0.f}, q[2] = {0.f, 0.f};
#pragma unroll
  for (int r = 0; r < kBN / 2; ++r) {
    s[(r / 2) % 2] += acc[r];
    q[(r / 2) % 2] += acc[r] * acc[r];
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    for (int m = 1; m < 4; m *= 2) {
      s[h] += __shfl_xor_sync(0xffffffffu, s[h], m);
      q[h] += __shfl_xor_sync(0xffffffffu, q[h], m);
    }
    const long long row = row0 + 8 * h, part = z * kTilesN + tn;
    if constexpr (kStatsPerCta) {
      run.s[h] += s[h];
      run.q[h] += q[h];
    } else if (lane % 4 == 0 && row < kM) {
      park_stats(stats, part, row, s[h], q[h]);
    }
  }
}

// Per-column partials over consumer c's 64 rows: each warp sums its 16 rows across lanes, then
// the four warps' sums meet in `scratch` (4 x BN pairs) in a fixed order.
__device__ __forceinline__ void column_stats(const float* acc, long long z, int tm, int tn, int c, int tid,
                                             float* scratch, float* stats, StatsRun& run) {
  const int warp = tid / 32, lane = tid % 32;
#pragma unroll
  for (int r = 0; r < kBN / 2; r += 4)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float s = acc[r + e] + acc[r + 2 + e], q = acc[r + e] * acc[r + e] + acc[r + 2 + e] * acc[r + 2 + e];
      for (int m = 4; m < 32; m *= 2) {
        s += __shfl_xor_sync(0xffffffffu, s, m);
        q += __shfl_xor_sync(0xffffffffu, q, m);
      }
      if (lane < 4) {
        const int col = 8 * (r / 4) + 2 * lane + e;
        scratch[2 * (warp * kBN + col)] = s;
        scratch[2 * (warp * kBN + col) + 1] = q;
      }
    }
  consumer_sync(c);
  const long long part = (z * kTilesM + tm) * kConsumers + c;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int col = tid + 128 * k;
    if (col >= kBN) break;
    float s = 0.f, q = 0.f;
    for (int w = 0; w < 4; ++w) {
      s += scratch[2 * (w * kBN + col)];
      q += scratch[2 * (w * kBN + col) + 1];
    }
    const long long n = static_cast<long long>(tn) * kBN + col;
    if constexpr (kStatsPerCta) {
      run.s[k] += s;
      run.q[k] += q;
    } else if (n < kStatsChannels) {
      park_stats(stats, part, n, s, q);
    }
  }
  consumer_sync(c);  // the next tile writes scratch again
}

// kStatsPerCta: the CTA's one partial (a consumer's, for column sums), once its tiles are done.
__device__ __forceinline__ void park_run(const StatsRun& run, int c, int tid, int lane, float* stats) {
  if constexpr (kColumnSums) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int col = tid + 128 * k;
      if (col < kBN && col < kStatsChannels)
        park_stats(stats, static_cast<long long>(blockIdx.x) * kConsumers + c, col, run.s[k], run.q[k]);
    }
  } else {
    const long long row0 = c * 64 + (tid / 32) * 16 + lane / 4;  // tile row 0: one tile spans the rows
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (lane % 4 == 0 && row0 + 8 * h < kM) park_stats(stats, blockIdx.x, row0 + 8 * h, run.s[h], run.q[h]);
  }
}

// The statistics' totals: once every block has parked its partials, the last one to finish
// adds them up (its consumer threads; the producers have returned). The counter starts at 0 and
// the last block puts it back, for the next launch or replay. `flag`: a word of the scratch past
// the barriers (no static shared memory: the stages may fill what the launch can have).
__device__ unsigned int kiln_gemm_stats_done;
// `scratch`: the first stage's tiles, which no MMA or load touches any more.
__device__ void stats_totals(const HookPointers& hp, int t, volatile unsigned* flag, double* scratch) {
  __threadfence();
  split_sync();
  if (t == 0) *flag = atomicAdd(&kiln_gemm_stats_done, 1u) == gridDim.x - 1 ? 1u : 0u;
  split_sync();
  if (*flag == 0u) return;
  if (t == 0) kiln_gemm_stats_done = 0;
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the tiles were the async proxy's
  auto sync = [] { split_sync(); };
  for (int half = 0; half < 2; ++half)  // the sums, then the squares
    kiln::block::sum_columns(hp.stats + half * stats_parts() * kStatsChannels, stats_parts(), kStatsChannels,
                             kStatsChannels, hp.totals + half * kStatsChannels, scratch, t, kConsumers * 128, sync);
}

}  // namespace

extern "C" __global__ void __launch_bounds__((kConsumers + 1) * 128, 1)
    kiln_gemm_wgmma(const __grid_constant__ TensorMap map_a, const __grid_constant__ TensorMap map_b, Out* __restrict__ d,
                    const __grid_constant__ HookPointers hp) {
  kiln::wait_prior_grids();
  extern __shared__ unsigned char smem_raw[];
  // The 128-byte swizzle repeats every 1024 bytes: tiles start on such a boundary.
  const unsigned base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const unsigned tiles_a = base, tiles_b = base + kStages * kBytesA;
  const unsigned lo_tiles = base + kStages * kStageBytes;  // SPLIT_F32, PAIRED
  const unsigned full = lo_tiles + kLoRegion, empty = full + kStages * 8;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      bar_init(full + 8 * s, 1);
      bar_init(empty + 8 * s, kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;

  if (wg == 0) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (tid != 0) return;
    int it = 0;
    for (int t = blockIdx.x; t < kTiles; t += gridDim.x) {
      int z, tm, tn;
      tile_coords(t, z, tm, tn);
      long long first, end;
      k_range(z, first, end);
      for (long long kt = first; kt < end; ++kt, ++it) {
        const int s = it % kStages;
        bar_wait(empty + 8 * s, ((it / kStages) & 1) ^ 1);
        bar_expect_bytes(full + 8 * s, kPaired ? 2 * kLoadBytes - kGyBytes : kLoadBytes);
        if constexpr (kConv) {
          load_conv_tiles(tiles_a + s * kBytesA, tiles_b + s * kBytesB, &map_a, &map_b, full + 8 * s, static_cast<int>(kt), z, tm,
                          tn, 0);
          if constexpr (kPaired) {
            const unsigned lo = lo_tiles + s * kStageBytes;
            load_conv_tiles(lo, lo + kBytesA, &map_a, &map_b, full + 8 * s, static_cast<int>(kt), z, tm, tn, kSliceC);
          }
        } else if constexpr (kWgrad) {
          load_wgrad_tiles(tiles_a + s * kBytesA, tiles_b + s * kBytesB, &map_a, &map_b, full + 8 * s, kt, tm, tn, 0);
          if constexpr (kPaired) {
            const unsigned lo = lo_tiles + s * kStageBytes;
            load_wgrad_tiles(lo, lo + kBytesA, &map_a, &map_b, full + 8 * s, kt, tm, tn, 1);
          }
        } else {
          load_tile<kAMn, kBM>(tiles_a + s * kBytesA, &map_a, full + 8 * s, kt, tm * kBM, kABatched ? z : 0);
          load_tile<kBMn, kBN>(tiles_b + s * kBytesB, &map_b, full + 8 * s, kt, tn * kBN, kBBatched ? z : 0);
        }
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 ${CONSUMER_REGS};");
  const int c = wg - 1, warp = tid / 32, lane = tid % 32;
  // PAIRED: inf or NaN anywhere takes every k tile through the finite pass (rare; one read).
  [[maybe_unused]] bool any_odd = false;
  if constexpr (kPaired) any_odd = *hp.odd != 0;
  float acc[kBN / 2] = {};  // the first MMA of a tile overwrites them; zeroed so none is read unset
  [[maybe_unused]] StatsRun run;  // kStatsPerCta
  int it = 0;
  for (int t = blockIdx.x; t < kTiles; t += gridDim.x) {
    int z, tm, tn;
    tile_coords(t, z, tm, tn);
    long long first, end;
    k_range(z, first, end);
    int held = -1;  // the stage whose MMAs may still be running
    for (long long kt = first; kt < end; ++kt, ++it) {
      const int s = it % kStages;
      bar_wait(full + 8 * s, (it / kStages) & 1);
      if constexpr (kPrologue) {
        prologue_tile(tiles_a + s * kBytesA + c * 64 * 128, kt, z, tid, hp);
        consumer_sync(c);
      }
      // Consumer c's 64 rows of A: 64 K-major rows, or the c-th MN-major atom; both 8 KiB in.
      const unsigned long long da = smem_desc(tiles_a + s * kBytesA + c * 64 * 128, kAtomBytes);
      const unsigned long long db = smem_desc(tiles_b + s * kBytesB, kAtomBytes);
      if constexpr (kSplitF32 || kPaired) {
        const int t = c * 128 + tid;
        unsigned lo_a, lo_b;
        bool odd = any_odd;
        if constexpr (kPaired) {  // the stage's own lo tiles, loaded with it
          lo_a = lo_tiles + s * kStageBytes, lo_b = lo_a + kBytesA;
          if constexpr (kSplitGy) {  // but gy's, split here into its slot (last read kStages tiles ago)
            odd = (kTransposed ? split_tile<kLoadedB>(tiles_b + s * kBytesB, lo_b, t)
                               : split_tile<kLoadedA>(tiles_a + s * kBytesA, lo_a, t)) ||
                  odd;
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            odd = split_sync_any(odd);
          }
        } else {
          // This k tile's lo tiles were read by the MMAs of the one two before, which every
          // consumer has waited for.
          split_sync();
          lo_a = lo_tiles + (it & 1) * kLoBytes, lo_b = lo_a + kLoBytesA;
          odd = split_tile<kLoadedB>(tiles_b + s * kBytesB, lo_b, t);
          if constexpr (!kRegA) odd = split_tile<kLoadedA>(tiles_a + s * kBytesA, lo_a, t) || odd;
          asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
          odd = split_sync_any(odd);
        }
        [[maybe_unused]] const unsigned long long dla = smem_desc(lo_a + c * 64 * 128, kAtomBytes);
        const unsigned long long dlb = smem_desc(lo_b, kAtomBytes);
        [[maybe_unused]] unsigned a[kBK / kMmaK][4];
        if constexpr (kRegA) load_a_fragments(a, tiles_a + s * kBytesA, c, warp, lane);
        if constexpr (kOverlapRegA) {  // the split fragments below overwrite what they read
          asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
          if (tid == 0 && held >= 0) bar_arrive(empty + 8 * held);
          held = -1;
        }
        // hi * hi; then lo * hi and hi * lo (where a tile holds inf or NaN, its hi made finite
        // first). No MMA sits in a branch: the compiler would serialize them all.
        [[maybe_unused]] unsigned h[kBK / kMmaK][4], l[kBK / kMmaK][4], f[kBK / kMmaK][4];
        if constexpr (kRegA)
#pragma unroll
          for (int kk = 0; kk < kBK / kMmaK; ++kk) split_fragment(a[kk], h[kk], l[kk], f[kk]);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < kBK / kMmaK; ++kk) {
          if constexpr (kRegA) {
            mma_rs(acc, h[kk], db + kk * (kStepB >> 4), kt > first || kk > 0);
          } else {
            mma(acc, da + kk * (kStepA >> 4), db + kk * (kStepB >> 4), kt > first || kk > 0);
          }
        }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        if (odd) {
          asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
          split_sync();
          finite_tile<kLoadedB>(tiles_b + s * kBytesB, t);
          if constexpr (!kRegA) finite_tile<kLoadedA>(tiles_a + s * kBytesA, t);
          asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
          split_sync();
        }
#pragma unroll
        for (int kk = 0; kk < kBK / kMmaK; ++kk) {
          if constexpr (kRegA) {
            mma_rs(acc, l[kk], db + kk * (kStepB >> 4), true);
            mma_rs(acc, f[kk], dlb + kk * (kStepB >> 4), true);
          } else {
            mma(acc, dla + kk * (kStepA >> 4), db + kk * (kStepB >> 4), true);
            mma(acc, da + kk * (kStepA >> 4), dlb + kk * (kStepB >> 4), true);
          }
        }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        // The previous k tile's two groups finish while this one's run; its stage is freed. With
        // A in registers, which the next k tile rewrites, this one's finish too (kOverlapRegA:
        // once the next tile's B is split and its fragments loaded).
        if constexpr (kRegA && !kOverlapRegA) {
          asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        } else if constexpr (!kRegA) {
          asm volatile("wgmma.wait_group.sync.aligned 2;" ::: "memory");
        }
        if (tid == 0 && held >= 0) bar_arrive(empty + 8 * held);
        held = s;
        continue;
      }
      if constexpr (kRegA) {
        unsigned a[kBK / kMmaK][4];
        load_a_fragments(a, tiles_a + s * kBytesA, c, warp, lane);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < kBK / kMmaK; ++kk) mma_rs(acc, a[kk], db + kk * (kStepB >> 4), kt > first || kk > 0);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        // The next k tile rewrites A's registers: these MMAs finish first, and free the stage.
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        if (tid == 0) bar_arrive(empty + 8 * s);
        continue;
      }
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
      for (int kk = 0; kk < kBK / kMmaK; ++kk)
        mma(acc, da + kk * (kStepA >> 4), db + kk * (kStepB >> 4), kt > first || kk > 0);
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      // This k tile's MMAs run on while the previous tile's are waited for and its stage freed.
      asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
      if (tid == 0 && held >= 0) bar_arrive(empty + 8 * held);
      held = s;
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    if (tid == 0 && held >= 0) bar_arrive(empty + 8 * held);
    // Accumulator layout of m64nN: register r holds row 16*warp + lane/4 + 8*((r/2)%2) and
    // column 8*(r/4) + 2*(lane%4) + r%2 of the warpgroup's 64 x BN block.
    const long long row0 = static_cast<long long>(tm) * kBM + c * 64 + warp * 16 + lane / 4;
    if constexpr (kStagedStores) {  // 2 KiB a warp past the barriers (no statistics scratch here)
      const unsigned buf = empty + kStages * 8 + (c * 4 + warp) * 2048;
      store_staged<0>(acc, z, tn, row0 - lane / 4, lane, buf, d, hp);
    } else {
#pragma unroll
      for (int r = 0; r < kBN / 2; r += 2) {
        const long long row = row0 + 8 * ((r / 2) % 2);
        // Columns j and j + 1 lie side by side in D whenever both exist.
        const int j = 8 * (r / 4) + 2 * (lane % 4);
        if constexpr (kTransposed) {  // row: D's column (a pixel of box tm, or a tap's channel); j, j + 1: D's rows
          const long long col = kConv ? column_of(tm, static_cast<int>(row - static_cast<long long>(tm) * kBM))
                                : row < kN ? row
                                           : -1;
          const long long drow = static_cast<long long>(tn) * kBN + j;
          Out* p = d + z * kBatchD + drow * kLdd + col;
          const bool in0 = col >= 0 && drow < kM, in1 = col >= 0 && drow + 1 < kM;
          const float v0 = in0 ? epilogue(acc[r], drow, col, z, hp) : 0.f;
          const float v1 = in1 ? epilogue(acc[r + 1], drow + 1, col, z, hp) : 0.f;
          if (in0) *p = kiln::cvt<Out>(v0);
          if (in1) p[kLdd] = kiln::cvt<Out>(v1);
          if constexpr (kStats != 0) {  // the values as stored; zeros outside D
            acc[r] = kiln::cvt<float>(kiln::cvt<Out>(v0));
            acc[r + 1] = kiln::cvt<float>(kiln::cvt<Out>(v1));
          }
          continue;
        }
        if constexpr (kPairsWhole) {
          const long long col = column_of(tn, j);
          float v0 = 0.f, v1 = 0.f;
          if (row < kM && col >= 0) {
            Out* p = d + z * kBatchD + row * kLdd + col;
            v0 = epilogue(acc[r], row, col, z, hp);
            v1 = epilogue(acc[r + 1], row, col + 1, z, hp);
            if constexpr (kAccumulate) {
              v0 += kiln::cvt<float>(p[0]);
              v1 += kiln::cvt<float>(p[1]);
            }
            store_pair(p, v0, v1);
          }
          if constexpr (kStats != 0) {  // the values as stored; zeros outside D
            acc[r] = kiln::cvt<float>(kiln::cvt<Out>(v0));
            acc[r + 1] = kiln::cvt<float>(kiln::cvt<Out>(v1));
          }
          continue;
        }
        const long long col = column_of(tn, j), next = column_of(tn, j + 1);
        const bool in0 = row < kM && col >= 0, in1 = in0 && next == col + 1;
        const bool alone1 = row < kM && next >= 0 && next != col + 1;  // j + 1 starts another output row
        Out* p = d + z * kBatchD + row * kLdd + col;
        float v0 = in0 ? epilogue(acc[r], row, col, z, hp) : 0.f;
        Out* p1 = d + z * kBatchD + row * kLdd + next;
        float v1 = in1 || alone1 ? epilogue(acc[r + 1], row, next, z, hp) : 0.f;
        if constexpr (kAccumulate) {
          if (in0) v0 += kiln::cvt<float>(p[0]);
          if (in1 || alone1) v1 += kiln::cvt<float>(*p1);
        }
        if (in1) {
          store_pair(p, v0, v1);
        } else {
          if (in0) *p = kiln::cvt<Out>(v0);
          if (alone1) *p1 = kiln::cvt<Out>(v1);
        }
        if constexpr (kStats != 0) {  // the values as stored; zeros outside D
          acc[r] = kiln::cvt<float>(kiln::cvt<Out>(v0));
          acc[r + 1] = kiln::cvt<float>(kiln::cvt<Out>(v1));
        }
      }
    }
    if constexpr (kStats == 1 && !kTransposed) row_stats(acc, z, tn, row0, lane, hp.stats, run);
    if constexpr (kColumnSums) {  // scratch: past the barriers, 4 x BN pairs per consumer
      float* scratch = reinterpret_cast<float*>(smem_raw + (empty + kStages * 8 - smem_addr(smem_raw)));
      column_stats(acc, z, tm, tn, c, tid, scratch + c * 4 * kBN * 2, hp.stats, run);
    }
  }
  if constexpr (kStatsPerCta) park_run(run, c, tid, lane, hp.stats);
  if constexpr (kStats != 0)
    if (hp.totals)
      stats_totals(hp, c * 128 + tid,
                   reinterpret_cast<unsigned*>(smem_raw + (empty + kStages * 8 - smem_addr(smem_raw))),
                   reinterpret_cast<double*>(smem_raw + (tiles_a - smem_addr(smem_raw))));
}
