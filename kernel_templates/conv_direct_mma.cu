// The direct kind on tensor cores (bf16, f16: mma.sync m16n8k16, f32 sums): a stride-1 conv
// over few channels (a first conv's forward, or the input gradient of a conv to few channels,
// FLIP as in conv_direct.cu) as a GEMM whose k is the taps, too short for the tile kinds. A
// block stages a band of its image's input rows, zero-padded, and the weights in shared memory;
// each warp takes 16-pixel runs of the band's output rows in turn (OW rounded up to 16) and
// computes them for every channel: A (pixels x taps) is gathered from the staged rows (a tap
// past the last reads a plane of zeros), B (taps x channels) is the weights, held in registers
// for the whole block. A run's outputs go through shared memory, to be stored a row at a time.
// With STATS, each warp sums its channels' values as stored and squares over its pixels, the
// warps' sums are added in warp order into the block's column of parts (conv_stats.cu).
// clang-format off
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
typedef ${T} T;
#define MMA ${MMA}  // 0 bf16, 1 f16
${MMA_OPS}
// clang-format on

// The pass as a forward conv: CI channels of HI x WI in, CO of HO x WO out, padding PH x PW.
constexpr int CI = ${CI}, HI = ${HI}, WI = ${WI}, CO = ${CO}, HO = ${HO}, WO = ${WO};
constexpr int KH = ${KH}, KW = ${KW}, PH = ${PH}, PW = ${PW};
constexpr bool FLIP = ${FLIP}, STATS = ${STATS};
constexpr int ROWS = ${ROWS}, THREADS = 256, WARPS = THREADS / 32;
constexpr int TAPS = CI * KH * KW, KT = (TAPS + 15) / 16, NT = (CO + 7) / 8;
constexpr int WOP = (WO + 15) / 16 * 16, RUNS = WOP / 16, BANDS = (HO + ROWS - 1) / ROWS;
// The staged band: CI planes of SH x SWP, then a plane of zeros; the weights as [NT * 8][KT * 16]
// (zeros past either end); each warp's outputs of a run, [NT * 8][16], before they are stored.
constexpr int SH = ROWS + KH - 1, SWP = WOP + KW - 1, PLANE = SH * SWP, XS = (CI + 1) * PLANE;
constexpr int WK = KT * 16, WSM = NT * 8 * WK, RUN_OUT = NT * 8 * 16;
static_assert(MMA == 0 || MMA == 1, "16-bit operands");

// Elements of a run a store writes: up to 8 (16 bytes), dividing a row and the run.
constexpr int out_vector() {
  int v = 8;
  while (v > 1 && WO % v != 0) v /= 2;
  return v;
}

// clang-format off
${CONV_STATS}
// clang-format on

// Weight (co, tap) of the pass as a forward conv, tap = (ci, r, s); 0 past either end.
__device__ __forceinline__ unsigned short weight(const T* __restrict__ w, int co, int tap) {
  if (co >= CO || tap >= TAPS) return 0;
  const int ci = tap / (KH * KW), r = tap / KW % KH, s = tap % KW;
  const T v = FLIP ? w[((ci * CO + co) * KH + KH - 1 - r) * KW + KW - 1 - s] : w[co * TAPS + tap];
  return *reinterpret_cast<const unsigned short*>(&v);
}

// Stages the band's rows and the weights, 16 loads of a thread in flight before their stores.
__device__ __forceinline__ void stage(const T* __restrict__ src, const T* __restrict__ w, T* xs, unsigned short* wsm,
                                      int y0) {
  constexpr int U = 16;
  for (int i0 = threadIdx.x; i0 < XS + WSM; i0 += U * THREADS) {
    unsigned short v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = i0 + u * THREADS;
      if (i < XS) {
        const int ix = i % SWP - PW, iy = y0 + i / SWP % SH - PH, ci = i / PLANE;
        const bool in = ci < CI && iy >= 0 && iy < HI && ix >= 0 && ix < WI;
        const T x = in ? src[(ci * HI + iy) * WI + ix] : kiln::cvt<T>(0.f);
        v[u] = *reinterpret_cast<const unsigned short*>(&x);
      } else if (i < XS + WSM) {
        v[u] = weight(w, (i - XS) / WK, (i - XS) % WK);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = i0 + u * THREADS;
      if (i < XS)
        reinterpret_cast<unsigned short*>(xs)[i] = v[u];
      else if (i < XS + WSM)
        wsm[i - XS] = v[u];
    }
  }
}

// Where tap k's input sits in the staged band relative to its output pixel; the zero plane
// past the last tap.
__device__ __forceinline__ int tap_offset(int k) {
  return k < TAPS ? (k / (KH * KW) * SH + k / KW % KH) * SWP + k % KW : CI * PLANE;
}

extern "C" __global__ void __launch_bounds__(THREADS)
    kiln_conv_direct(const T* __restrict__ in, const T* __restrict__ w, T* __restrict__ out, float* parts) {
  kiln::wait_prior_grids();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* xs = reinterpret_cast<T*>(smem_raw);  // [CI + 1][SH][SWP]
  const unsigned short* xh = reinterpret_cast<const unsigned short*>(xs);
  unsigned short* wsm = reinterpret_cast<unsigned short*>(smem_raw + (XS * sizeof(T) + 15) / 16 * 16);
  T* outs = reinterpret_cast<T*>(wsm + WSM);                      // [WARPS][RUN_OUT]
  float* red = reinterpret_cast<float*>(outs + WARPS * RUN_OUT);  // [WARPS][2][NT * 8]
  const int n = blockIdx.x / BANDS, y0 = (blockIdx.x % BANDS) * ROWS, rows = min(ROWS, HO - y0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  constexpr int V = out_vector();
  const bool vectors = V > 1 && kiln::aligned<V>(out);

  stage(in + static_cast<long long>(n) * CI * HI * WI, w, xs, wsm, y0);
  __syncthreads();
  // B fragments: channel nt * 8 + g, taps kt * 16 + 2t, 2t + 1 (b[.][.][0]) and 2t + 8, 2t + 9.
  unsigned b[KT][NT][2];
#pragma unroll
  for (int kt = 0; kt < KT; ++kt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        b[kt][nt][h] = *reinterpret_cast<const unsigned*>(wsm + (nt * 8 + g) * WK + kt * 16 + 2 * t + 8 * h);
  // A fragments' taps: kt * 16 + 2t, 2t + 1, 2t + 8, 2t + 9.
  int off[KT][4];
#pragma unroll
  for (int kt = 0; kt < KT; ++kt)
#pragma unroll
    for (int j = 0; j < 4; ++j) off[kt][j] = tap_offset(kt * 16 + 2 * t + (j & 1) + (j >> 1) * 8);
  float sum[NT][2], sq[NT][2];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j) sum[nt][j] = sq[nt][j] = 0.f;

  for (int m = warp; m < rows * RUNS; m += WARPS) {
    const int oy = m / RUNS, x0 = m % RUNS * 16;
    const unsigned short* base = xh + oy * SWP + x0 + g;
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
#pragma unroll
    for (int kt = 0; kt < KT; ++kt) {
      const unsigned a[4] = {pack(base[off[kt][0]], base[off[kt][1]]), pack(base[off[kt][0] + 8], base[off[kt][1] + 8]),
                             pack(base[off[kt][2]], base[off[kt][3]]),
                             pack(base[off[kt][2] + 8], base[off[kt][3] + 8])};
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma(acc[nt], a, b[kt][nt]);
    }
    // Element e: pixel g (+ 8 for e >= 2), channel nt * 8 + 2t (+ 1 for odd e), through the
    // warp's run of outputs so that each channel's pixels are stored V at a time.
    T* run = outs + warp * RUN_OUT;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int co = nt * 8 + 2 * t + (e & 1), p = g + (e >> 1) * 8;
        const T v = kiln::cvt<T>(acc[nt][e]);
        run[co * 16 + p] = v;
        if (STATS && co < CO && x0 + p < WO) {  // the values as stored
          const float f = kiln::cvt<float>(v);
          sum[nt][e & 1] += f;
          sq[nt][e & 1] += f * f;
        }
      }
    __syncwarp();
    T* dst = out + (static_cast<long long>(n) * CO * HO + y0 + oy) * WO + x0;
    if (vectors) {
      for (int j = lane; j < CO * (16 / V); j += 32) {
        const int co = j / (16 / V), p = j % (16 / V) * V;
        if (x0 + p < WO)
          *reinterpret_cast<kiln::Vec<T, V>*>(dst + static_cast<long long>(co) * HO * WO + p) =
              *reinterpret_cast<const kiln::Vec<T, V>*>(run + co * 16 + p);
      }
    } else {
      for (int j = lane; j < CO * 16; j += 32)
        if (x0 + j % 16 < WO) dst[static_cast<long long>(j / 16) * HO * WO + j % 16] = run[j];
    }
    __syncwarp();  // the run is rewritten by the warp's next one
  }
  if constexpr (STATS) {
    // The warp's sums over its pixels (lanes of one t), then the block's in warp order.
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int d = 4; d < 32; d *= 2) {
          sum[nt][j] += __shfl_xor_sync(0xffffffffu, sum[nt][j], d);
          sq[nt][j] += __shfl_xor_sync(0xffffffffu, sq[nt][j], d);
        }
    if (g == 0)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          red[(warp * 2 + 0) * NT * 8 + nt * 8 + 2 * t + j] = sum[nt][j];
          red[(warp * 2 + 1) * NT * 8 + nt * 8 + 2 * t + j] = sq[nt][j];
        }
    __syncthreads();
    for (int item = threadIdx.x; item < 2 * CO; item += THREADS) {
      const int half = item / CO, co = item % CO;
      float v = 0.f;
      for (int k = 0; k < WARPS; ++k) v += red[(k * 2 + half) * NT * 8 + co];
      park_conv_stat(parts, item, v);
    }
  }
}
