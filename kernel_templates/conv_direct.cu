// Stride-1 convolution over few channels on the CUDA cores, generated for one exact shape: a
// first conv's forward (its implicit GEMM sums too few products to fill a tensor-core tile) or
// the input gradient of a conv to few channels (its tiles would hold a few rows). The input
// gradient is the forward over gy with the weights transposed and flipped and the padding
// mirrored (FLIP). A block stages a band of its image's input rows, zero-padded, and every
// weight in shared memory as f32; a thread sums OT output channels at P neighbouring pixels of
// one row, its window of the input in registers. f32 FMAs are exact f32's arithmetic, so the
// kernel serves every math; 16-bit operands whose weights fit a thread's tensor-core tiles take
// conv_direct_mma.cu. With STATS (a forward whose output a batch norm reads next), each
// block also parks per-channel sums and squares of the values it stored (conv_stats.cu).
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
typedef ${T} T;

// The pass as a forward conv: CI channels of HI x WI in, CO of HO x WO out, padding PH x PW.
constexpr int CI = ${CI}, HI = ${HI}, WI = ${WI}, CO = ${CO}, HO = ${HO}, WO = ${WO};
constexpr int KH = ${KH}, KW = ${KW}, PH = ${PH}, PW = ${PW};
constexpr bool FLIP = ${FLIP}, STATS = ${STATS};
constexpr int OT = ${OT}, P = ${P}, ROWS = ${ROWS}, THREADS = ${THREADS};
constexpr int GX = (WO + P - 1) / P, GO = (CO + OT - 1) / OT, BANDS = (HO + ROWS - 1) / ROWS;
constexpr int COP = GO * OT;                              // channels as staged (zero weights past CO)
constexpr int SH = ROWS + KH - 1, SW = GX * P + KW - 1;  // the staged band: CI x SH x SW
constexpr int WEIGHTS = CI * KH * KW * COP;
// Whole vectors of P outputs per thread where rows are multiples of P (and `out` is aligned).
constexpr bool VEC_STORE = WO % P == 0;

// clang-format off
${CONV_STATS}
// clang-format on

// STATS: each channel's sum and sum of squares of the values this block stored, over the
// threads of its group (go) in a fixed order, parked as its column of parts (2 * CO, blocks).
// `red` holds each thread's sums: [2][OT][THREADS] floats.
__device__ __forceinline__ void stats_of_block(float* red, float* parts) {
  __syncthreads();
  const int lane = threadIdx.x % 32, group = GX * ROWS;
  for (int item = threadIdx.x / 32; item < 2 * CO; item += THREADS / 32) {
    const int half = item / CO, co = item % CO;
    const float* r = red + (half * OT + co % OT) * THREADS + (co / OT) * group;
    float s = 0.f;
    for (int i = lane; i < group; i += 32) s += r[i];
    for (int m = 16; m >= 1; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
    if (lane == 0) park_conv_stat(parts, item, s);
  }
}

extern "C" __global__ void __launch_bounds__(THREADS)
    kiln_conv_direct(const T* __restrict__ in, const T* __restrict__ w, T* __restrict__ out, float* parts) {
  kiln::wait_prior_grids();
  extern __shared__ __align__(16) float smem[];
  float* ws = smem;            // [CI][KH][KW][COP]
  float* xs = smem + WEIGHTS;  // [CI][SH][SW]
  const int n = blockIdx.x / BANDS, y0 = (blockIdx.x % BANDS) * ROWS;
  for (int i = threadIdx.x; i < WEIGHTS; i += THREADS) {
    const int co = i % COP, s = (i / COP) % KW, r = (i / (COP * KW)) % KH, ci = i / (COP * KW * KH);
    float v = 0.f;
    if (co < CO)
      v = kiln::cvt<float>(FLIP ? w[((ci * CO + co) * KH + KH - 1 - r) * KW + KW - 1 - s]
                                : w[((co * CI + ci) * KH + r) * KW + s]);
    ws[i] = v;
  }
  const T* src = in + static_cast<long long>(n) * CI * HI * WI;
  for (int i = threadIdx.x; i < CI * SH * SW; i += THREADS) {
    const int ix = i % SW - PW, iy = y0 + (i / SW) % SH - PH, ci = i / (SW * SH);
    xs[i] = iy >= 0 && iy < HI && ix >= 0 && ix < WI ? kiln::cvt<float>(src[(ci * HI + iy) * WI + ix]) : 0.f;
  }
  __syncthreads();
  const int gx = threadIdx.x % GX, row = (threadIdx.x / GX) % ROWS, go = threadIdx.x / (GX * ROWS);
  const int oy = y0 + row;
  // Threads past the output store nothing; with STATS they stay for the block's sums.
  const bool live = go < GO && oy < HO;
  if (!STATS && !live) return;
  float acc[OT][P];
#pragma unroll
  for (int t = 0; t < OT; ++t)
#pragma unroll
    for (int p = 0; p < P; ++p) acc[t][p] = 0.f;
  for (int ci = 0; ci < (live ? CI : 0); ++ci)
#pragma unroll
    for (int r = 0; r < KH; ++r) {
      const float* xr = xs + (ci * SH + row + r) * SW + gx * P;
      float win[P + KW - 1];
#pragma unroll
      for (int j = 0; j < P + KW - 1; ++j) win[j] = xr[j];
#pragma unroll
      for (int s = 0; s < KW; ++s) {
        const float* wr = ws + ((ci * KH + r) * KW + s) * COP + go * OT;
#pragma unroll
        for (int t = 0; t < OT; ++t) {
          const float wv = wr[t];
#pragma unroll
          for (int p = 0; p < P; ++p) acc[t][p] = fmaf(wv, win[p + s], acc[t][p]);
        }
      }
    }
  T* dst = out + (static_cast<long long>(n) * CO * HO + oy) * WO + gx * P;
  const bool vec = VEC_STORE && kiln::aligned<P>(out);
#pragma unroll
  for (int t = 0; t < OT; ++t) {
    const int co = go * OT + t;
    if constexpr (STATS) {  // the values as stored
      float* red = xs + CI * SH * SW;
      float s = 0.f, q = 0.f;
#pragma unroll
      for (int p = 0; p < P; ++p)
        if (live && co < CO && gx * P + p < WO) {
          const float v = kiln::cvt<float>(kiln::cvt<T>(acc[t][p]));
          s += v;
          q += v * v;
        }
      red[t * THREADS + threadIdx.x] = s;
      red[(OT + t) * THREADS + threadIdx.x] = q;
    }
    if (!live || co >= CO) continue;
    T* o = dst + static_cast<long long>(co) * HO * WO;
    if (vec) {
      kiln::Vec<T, P> v;
#pragma unroll
      for (int p = 0; p < P; ++p) v.v[p] = kiln::cvt<T>(acc[t][p]);
      *reinterpret_cast<kiln::Vec<T, P>*>(o) = v;
    } else {
#pragma unroll
      for (int p = 0; p < P; ++p)
        if (gx * P + p < WO) o[p] = kiln::cvt<T>(acc[t][p]);
    }
  }
  if constexpr (STATS) stats_of_block(xs + CI * SH * SW, parts);
}
