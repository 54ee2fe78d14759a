// Weight gradient of a conv with few weights and a long sum over pixels (a first conv over
// 1-channel images: 600 weights, 147k pixels per weight at batch 256), where tensor-core tiles
// would sit mostly idle. f32 FMAs on CUDA cores over gy and the zero-padded input staged per
// image in shared memory. Thread (o, c, r) keeps the KW sums of its kernel row; with stride and
// dilation 1 the KW inputs it needs slide along the row in registers. Block b sums images
// [b * IPB, (b + 1) * IPB) into row b of an f32 workspace; a second kernel adds the rows in
// block order, so runs and graph replays are bit-identical. Groups = 1.
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
typedef ${T} T;

constexpr int N = ${N}, C = ${C}, H = ${H}, W = ${W}, O = ${O}, KH = ${KH}, KW = ${KW}, OH = ${OH}, OW = ${OW};
constexpr int SH = ${SH}, SW = ${SW}, PH = ${PH}, PW = ${PW}, DH = ${DH}, DW = ${DW}, IPB = ${IPB};
constexpr int THREADS = 256, Q = O * C * KH, LANES = Q <= THREADS / 2 ? THREADS / Q : 1;
constexpr int HP = H + 2 * PH, WP = W + 2 * PW;  // the zero-padded input plane
constexpr int GY = O * OH * OW, XS = C * HP * WP, TOTAL = Q * KW, BLOCKS = (N + IPB - 1) / IPB;

extern "C" __global__ void __launch_bounds__(THREADS)
kiln_conv_wgrad_small(const T* __restrict__ x, const T* __restrict__ gy, float* __restrict__ ws) {
  kiln::wait_prior_grids();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* gys = reinterpret_cast<T*>(smem_raw);  // [O][OH * OW]
  T* xs = gys + GY;                         // [C][HP][WP]
  float* lanes_out = reinterpret_cast<float*>(smem_raw);  // [LANES][Q * KW], after the images
  const int tid = threadIdx.x, q = tid % Q, lane = tid / Q;
  const int o = q / (C * KH), c = (q / KH) % C, r = q % KH;
  float acc[KW];
#pragma unroll
  for (int s = 0; s < KW; ++s) acc[s] = 0.f;

  for (int n = blockIdx.x * IPB; n < N && n < (blockIdx.x + 1) * IPB; ++n) {
    __syncthreads();  // the previous image's reads are done
    const T* gn = gy + static_cast<long long>(n) * GY;
    for (int i = tid; i < GY; i += THREADS) gys[i] = gn[i];
    const T* xn = x + static_cast<long long>(n) * C * H * W;
    for (int i = tid; i < XS; i += THREADS) {
      const int iy = (i / WP) % HP - PH, ix = i % WP - PW, cc = i / (WP * HP);
      xs[i] = iy >= 0 && iy < H && ix >= 0 && ix < W ? xn[(cc * H + iy) * W + ix] : kiln::cvt<T>(0.f);
    }
    __syncthreads();
    if (lane >= LANES) continue;
    for (int oy = lane; oy < OH; oy += LANES) {
      const T* grow = gys + (o * OH + oy) * OW;
      const T* xrow = xs + (c * HP + oy * SH + r * DH) * WP;
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
    ws[static_cast<long long>(blockIdx.x) * TOTAL + i] = v;
  }
}

// dw[i] = sum over blocks of ws[b][i], a warp per weight: lane l takes blocks l, l + 32, ...
// in order, then a fixed butterfly adds the lanes.
extern "C" __global__ void __launch_bounds__(THREADS)
kiln_conv_wgrad_small_reduce(const float* __restrict__ ws, T* __restrict__ dw) {
  kiln::wait_prior_grids();
  const int lane = threadIdx.x & 31;
  const long long warps = static_cast<long long>(gridDim.x) * (THREADS / 32);
  for (long long i = (static_cast<long long>(blockIdx.x) * THREADS + threadIdx.x) / 32; i < TOTAL; i += warps) {
    float v = 0.f;
    for (int b = lane; b < BLOCKS; b += 32) v += ws[static_cast<long long>(b) * TOTAL + i];
    v = kiln::warp::sum(v);
    if (lane == 0) dw[i] = kiln::cvt<T>(v);
  }
}
