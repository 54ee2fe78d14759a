// Weight gradient of a conv with few weights and a long sum over pixels (a first conv over
// 1-channel images: 600 weights, 147k pixels per weight at batch 256) on CUDA cores: exact f32,
// and 16-bit operands whose tensor-core tiles would not fit a warp (conv_wgrad_small_mma.cu
// takes the others). f32 FMAs over gy and the zero-padded input staged per image in shared
// memory. Thread (o, c, r) keeps the KW sums of its kernel row; with stride and dilation 1 the
// KW inputs it needs slide along the row in registers. Block b sums a band of output rows
// (b % BANDS) of images [g * IPB, (g + 1) * IPB), g = b / BANDS, into row b of an f32
// workspace [block][weight]; a second kernel adds each weight's column in block order, so runs
// and graph replays are bit-identical. Groups = 1. The batch is an argument, so a batch of
// another size (a short last step) whose bands and images per block are the same shares the module.
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
typedef ${T} T;
typedef ${TD} TD;  // dw's type: T, or f32 for 16-bit operands' sums kept in f32

constexpr int C = ${C}, H = ${H}, W = ${W}, O = ${O}, KH = ${KH}, KW = ${KW}, OH = ${OH}, OW = ${OW};
constexpr int SH = ${SH}, SW = ${SW}, PH = ${PH}, PW = ${PW}, DH = ${DH}, DW = ${DW}, IPB = ${IPB};
// A band of BROWS output rows; GYS: its gy rows per output channel as staged, padded so that
// the threads of a warp, which read the same pixel of neighbouring channels, hit different banks.
constexpr int BANDS = ${BANDS}, BROWS = ${BROWS}, GYS = ${GYS};
constexpr int THREADS = 256, Q = O * C * KH, LANES = Q <= THREADS / 2 ? THREADS / Q : 1;
constexpr int HP = H + 2 * PH, WP = W + 2 * PW;  // the zero-padded input plane
constexpr int GY = O * OH * OW, XS = C * HP * WP, TOTAL = Q * KW;

// Elements per global load of gy: up to 16 bytes, dividing a row so no load crosses one.
constexpr int gy_vector() {
  int v = 16 / static_cast<int>(sizeof(T));
  while (v > 1 && OW % v != 0) v /= 2;
  return v;
}

// Stages rows [y0, y0 + rows) of every channel of gy_n into gys, V elements a load and U loads
// of a thread in flight before their stores.
template <int V>
__device__ __forceinline__ void stage_gy(const T* __restrict__ gy_n, T* gys, int y0, int rows) {
  constexpr int U = 8;
  const int per_channel = rows * OW / V, total = O * per_channel;
  for (int i0 = threadIdx.x; i0 < total; i0 += THREADS * U) {
    kiln::Vec<T, V> v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = i0 + u * THREADS, o = i / per_channel, j = i % per_channel;
      if (i < total) v[u] = *reinterpret_cast<const kiln::Vec<T, V>*>(gy_n + (o * OH + y0) * OW + j * V);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = i0 + u * THREADS, o = i / per_channel, j = i % per_channel;
      if (i < total)
#pragma unroll
        for (int e = 0; e < V; ++e) gys[o * GYS + j * V + e] = v[u].v[e];
    }
  }
}

extern "C" __global__ void __launch_bounds__(THREADS)
    kiln_conv_wgrad_small(const T* __restrict__ x, const T* __restrict__ gy, float* __restrict__ ws, int N) {
  kiln::wait_prior_grids();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* gys = reinterpret_cast<T*>(smem_raw);  // [O][GYS]: the band's rows
  T* xs = gys + O * GYS;                    // [C][HP][WP]
  float* lanes_out = reinterpret_cast<float*>(smem_raw);  // [LANES][Q * KW], after the images
  const int tid = threadIdx.x, q = tid % Q, lane = tid / Q;
  const int o = q / (C * KH), c = (q / KH) % C, r = q % KH;
  const int y0 = (blockIdx.x % BANDS) * BROWS, rows = min(BROWS, OH - y0), first = blockIdx.x / BANDS * IPB;
  constexpr int V = gy_vector();
  const bool vectors = V > 1 && kiln::aligned<V>(gy);
  float acc[KW];
#pragma unroll
  for (int s = 0; s < KW; ++s) acc[s] = 0.f;

  for (int n = first; n < N && n < first + IPB; ++n) {
    __syncthreads();  // the previous image's reads are done
    const T* gn = gy + static_cast<long long>(n) * GY;
    if (vectors)
      stage_gy<V>(gn, gys, y0, rows);
    else
      stage_gy<1>(gn, gys, y0, rows);
    const T* xn = x + static_cast<long long>(n) * C * H * W;
#pragma unroll 4
    for (int i = tid; i < XS; i += THREADS) {
      const int iy = (i / WP) % HP - PH, ix = i % WP - PW, cc = i / (WP * HP);
      xs[i] = iy >= 0 && iy < H && ix >= 0 && ix < W ? xn[(cc * H + iy) * W + ix] : kiln::cvt<T>(0.f);
    }
    __syncthreads();
    if (lane >= LANES) continue;
    for (int oy = lane; oy < rows; oy += LANES) {
      const T* grow = gys + o * GYS + oy * OW;
      const T* xrow = xs + (c * HP + (y0 + oy) * SH + r * DH) * WP;
      if constexpr (SW == 1 && DW == 1) {
        float win[KW];
#pragma unroll
        for (int s = 0; s + 1 < KW; ++s) win[s + 1] = kiln::cvt<float>(xrow[s]);
        for (int ox = 0; ox < OW; ++ox) {
#pragma unroll
          for (int s = 0; s + 1 < KW; ++s) win[s] = win[s + 1];
          win[KW - 1] = kiln::cvt<float>(xrow[ox + KW - 1]);
          const float g = kiln::cvt<float>(grow[ox]);
#pragma unroll
          for (int s = 0; s < KW; ++s) acc[s] = fmaf(g, win[s], acc[s]);
        }
      } else {
        for (int ox = 0; ox < OW; ++ox) {
          const float g = kiln::cvt<float>(grow[ox]);
#pragma unroll
          for (int s = 0; s < KW; ++s) acc[s] = fmaf(g, kiln::cvt<float>(xrow[ox * SW + s * DW]), acc[s]);
        }
      }
    }
  }

  // The lanes of one (o, c, r) add up in lane order.
  __syncthreads();
  if (lane < LANES)
#pragma unroll
    for (int s = 0; s < KW; ++s) lanes_out[lane * TOTAL + q * KW + s] = acc[s];
  __syncthreads();
  for (int i = tid; i < TOTAL; i += THREADS) {
    float v = 0.f;
    for (int l = 0; l < LANES; ++l) v += lanes_out[l * TOTAL + i];
    ws[static_cast<long long>(blockIdx.x) * TOTAL + i] = v;  // a row per block
  }
}

// clang-format off
${WGRAD_SMALL_REDUCE}
// clang-format on
