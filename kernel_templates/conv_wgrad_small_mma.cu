// The small weight-gradient kind on tensor cores (bf16, f16: mma.sync m16n8k16, f32 sums), for
// few taps and output channels (a first conv over 1-channel images: 25 taps, 24 channels, 147k
// pixels per weight at batch 256). The blocks and the f32 workspace are the CUDA-core kernel's
// (conv_wgrad_small.cu): block b sums a band of output rows of images [g * IPB, (g + 1) * IPB),
// g = b / BANDS, into row b of ws [block][weight], and the reduce kernel adds each column in
// order, so runs and graph replays are bit-identical. Per image, dw^T (taps x O) += X (taps x
// pixels) @ gy^T: A is gathered from the band's zero-padded input rows staged in shared memory
// (tap = (c, r, s) a row), B is gy staged in rows of OWP pixels (OW rounded up to 16, zeros
// after), so each k step of 16 is one output row's run; both are copied with cp.async where
// they allow, so an image costs one round trip to L2. Few taps (a warp's tiles of dw^T fit its
// registers): the warps take the band's k steps in turn and add their sums in warp order. Many
// (SPLIT_TAPS: a conv over 24 channels' 3 x 3 taps): each warp takes a run of the tap tiles
// through every k step, so no sums are added across warps.
// clang-format off
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
typedef ${T} T;
typedef ${TD} TD;  // dw's type: T, or f32 for sums kept in f32
#define MMA ${MMA}  // 0 bf16, 1 f16
${MMA_OPS}
// clang-format on

constexpr int C = ${C}, H = ${H}, W = ${W}, O = ${O}, KH = ${KH}, KW = ${KW}, OH = ${OH}, OW = ${OW};
constexpr int SH = ${SH}, SW = ${SW}, PH = ${PH}, PW = ${PW}, DH = ${DH}, DW = ${DW}, IPB = ${IPB};
constexpr int BANDS = ${BANDS}, BROWS = ${BROWS}, GYS = ${GYS};
constexpr bool SPLIT_TAPS = ${SPLIT_TAPS};
constexpr int THREADS = 256, WARPS = THREADS / 32;
constexpr int TAPS = C * KH * KW, TOTAL = O * TAPS, MT = (TAPS + 15) / 16, NT = (O + 7) / 8;
// A warp's tap tiles and the slabs of sums the warps leave: one each, or one shared.
constexpr int MTW = SPLIT_TAPS ? (MT + WARPS - 1) / WARPS : MT, SLABS = SPLIT_TAPS ? 1 : WARPS;
constexpr int OWP = (OW + 15) / 16 * 16, ROW_STEPS = OWP / 16;
// The band's input rows as staged: wide enough for the padded pixels' taps, zeros outside x.
constexpr int SROWS = (BROWS - 1) * SH + (KH - 1) * DH + 1;
constexpr int WPP_ = (OWP - 1) * SW + (KW - 1) * DW + 1 > W + 2 * PW ? (OWP - 1) * SW + (KW - 1) * DW + 1 : W + 2 * PW;
constexpr int WPP = (WPP_ + 1) / 2 * 2, XS = C * SROWS * WPP;
// The input's pixels go in pairs (cp.async of 4 bytes) where a pair stays one in the staged rows;
// the padding around them, zeroed once, is the same for every image of the band.
constexpr bool X_PAIRS = W % 2 == 0 && PW % 2 == 0;
// The warps' sums: [SLABS][NT * 8 channels][PT taps], PT such that the fragments' stores (8
// taps x 4 channel pairs) and the row sums' reads (consecutive taps) fall on distinct banks.
constexpr int PT = MT * 16 + 4;
static_assert(MMA == 0 || MMA == 1, "16-bit operands");
static_assert(GYS % 16 == 8 && GYS >= BROWS * OWP, "gy rows: 16-byte aligned, B fragments on distinct banks");

// Elements per copy of gy: up to 16 bytes, dividing a row so no copy crosses one.
constexpr int gy_vector() {
  int v = 16 / static_cast<int>(sizeof(T));
  while (v > 1 && OW % v != 0) v /= 2;
  return v;
}

// Stages gy rows [y0, y0 + rows) of every channel at row stride OWP, V elements a copy:
// asynchronously where a copy is 4 bytes or more, else by loads. The divisions are by constants.
template <int V>
__device__ __forceinline__ void stage_gy(const T* __restrict__ gy_n, T* gys, int y0, int rows) {
  constexpr int PER_ROW = OW / V, PER_CHANNEL = BROWS * PER_ROW;
  for (int i = threadIdx.x; i < O * PER_CHANNEL; i += THREADS) {
    const int o = i / PER_CHANNEL, oy = i % PER_CHANNEL / PER_ROW, x0 = i % PER_ROW * V;
    if (oy >= rows) continue;
    const T* src = gy_n + (o * OH + y0 + oy) * OW + x0;
    T* dst = gys + o * GYS + oy * OWP + x0;
    if constexpr (V * sizeof(T) >= 4)
      copy_async<V * sizeof(T)>(dst, src);
    else
      *dst = *src;
  }
}

// Stages the band's input rows, staged row 0 being input row ylo: the pixels alone, in pairs,
// asynchronously (the padding is zero already), or every staged element by loads.
__device__ __forceinline__ void stage_x(const T* __restrict__ xn, T* xs, int ylo, bool pairs) {
  if (X_PAIRS && pairs) {
    constexpr int PAIRS = W / 2;
    for (int i = threadIdx.x; i < C * SROWS * PAIRS; i += THREADS) {
      const int c = i / (SROWS * PAIRS), r = i % (SROWS * PAIRS) / PAIRS, ix = i % PAIRS * 2, iy = ylo + r;
      if (iy >= 0 && iy < H) copy_async<4>(xs + (c * SROWS + r) * WPP + PW + ix, xn + (c * H + iy) * W + ix);
    }
    return;
  }
#pragma unroll 4
  for (int i = threadIdx.x; i < XS; i += THREADS) {
    const int iy = i / WPP % SROWS + ylo, ix = i % WPP - PW, c = i / (WPP * SROWS);
    xs[i] = iy >= 0 && iy < H && ix >= 0 && ix < W ? xn[(c * H + iy) * W + ix] : kiln::cvt<T>(0.f);
  }
}

extern "C" __global__ void __launch_bounds__(THREADS, 2)
    kiln_conv_wgrad_small(const T* __restrict__ x, const T* __restrict__ gy, float* __restrict__ ws, int N) {
  kiln::wait_prior_grids();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* gys = reinterpret_cast<T*>(smem_raw);            // [NT * 8][GYS]
  T* xs = gys + NT * 8 * GYS;                         // [C + 1][SROWS][WPP], the last channel zeros
  float* parts = reinterpret_cast<float*>(smem_raw);  // [SLABS][NT * 8][PT], after the images
  const unsigned short* xh = reinterpret_cast<const unsigned short*>(xs);
  const int tid = threadIdx.x, warp = tid / 32, g = (tid % 32) / 4, t = tid % 4;
  const int y0 = (blockIdx.x % BANDS) * BROWS, rows = min(BROWS, OH - y0), first = blockIdx.x / BANDS * IPB;
  // This warp's first tap tile and k step, and its stride through the k steps.
  const int mt0 = SPLIT_TAPS ? warp * MTW : 0, k0 = SPLIT_TAPS ? 0 : warp, k_stride = SPLIT_TAPS ? 1 : WARPS;
  constexpr int V = gy_vector();
  const bool vectors = V > 1 && kiln::aligned<V>(gy), pairs = kiln::aligned<2>(x);

  // gy's padding (pixels OW..OWP, channels O..NT * 8), the input's (where its pixels are staged
  // alone) and the zero channel after the input's stay zero: staging writes only the rest.
  for (int i = tid; i < NT * 8 * GYS / 8; i += THREADS) reinterpret_cast<uint4*>(gys)[i] = make_uint4(0, 0, 0, 0);
  for (int i = tid; i < (C + 1) * SROWS * WPP / 2; i += THREADS) reinterpret_cast<unsigned*>(xs)[i] = 0u;
  // Where this thread's A rows (taps g and g + 8 of each 16; the zero channel past the last
  // tap) start in the staged rows; its k pairs are pixels 2t, 2t + 1 and 2t + 8, 2t + 9 of a step.
  int a_off[MTW][2];
#pragma unroll
  for (int mt = 0; mt < MTW; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int tap = (mt0 + mt) * 16 + g + 8 * h, c = tap / (KH * KW), r = tap / KW % KH, s = tap % KW;
      a_off[mt][h] = tap < TAPS ? (c * SROWS + r * DH) * WPP + s * DW + 2 * t * SW : C * SROWS * WPP + 2 * t * SW;
    }
  float acc[MTW][NT][4];
#pragma unroll
  for (int mt = 0; mt < MTW; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;

  for (int n = first; n < N && n < first + IPB; ++n) {
    __syncthreads();  // the previous image's reads (and the zeroing) are done
    const T* gn = gy + static_cast<long long>(n) * O * OH * OW;
    if (vectors)
      stage_gy<V>(gn, gys, y0, rows);
    else
      stage_gy<1>(gn, gys, y0, rows);
    stage_x(x + static_cast<long long>(n) * C * H * W, xs, y0 * SH - PH, pairs);
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    for (int k = mt0 < MT ? k0 : rows * ROW_STEPS; k < rows * ROW_STEPS; k += k_stride) {
      const int oy = k / ROW_STEPS, p0 = k % ROW_STEPS * 16;
      const int pb = oy * SH * WPP + p0 * SW;
      unsigned b[NT][2];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const T* p = gys + (nt * 8 + g) * GYS + oy * OWP + p0 + 2 * t;
        b[nt][0] = *reinterpret_cast<const unsigned*>(p);
        b[nt][1] = *reinterpret_cast<const unsigned*>(p + 8);
      }
#pragma unroll
      for (int mt = 0; mt < MTW; ++mt) {
        if (SPLIT_TAPS && mt0 + mt >= MT) break;
        unsigned a[4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const unsigned short* p = xh + a_off[mt][h] + pb;
          a[h] = pack(p[0], p[SW]);
          a[h + 2] = pack(p[8 * SW], p[9 * SW]);
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma(acc[mt][nt], a, b[nt]);
      }
    }
  }

  // The warps' sums, added in warp order: fragment element e is row g (+ 8 for e >= 2), column
  // 2t (+ 1 for odd e) of its 16 x 8 tile.
  __syncthreads();
  const int slab = SPLIT_TAPS ? 0 : warp;
#pragma unroll
  for (int mt = 0; mt < MTW; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (mt0 + mt < MT)
          parts[(slab * NT * 8 + nt * 8 + 2 * t + (e & 1)) * PT + (mt0 + mt) * 16 + g + (e >> 1) * 8] = acc[mt][nt][e];
  __syncthreads();
  for (int i = tid; i < TOTAL; i += THREADS) {
    const int o = i / TAPS, tap = i % TAPS;
    float v = 0.f;
    for (int w = 0; w < SLABS; ++w) v += parts[(w * NT * 8 + o) * PT + tap];
    ws[static_cast<long long>(blockIdx.x) * TOTAL + i] = v;  // a row per block
  }
}

// clang-format off
${WGRAD_SMALL_REDUCE}
// clang-format on
