// Implicit-GEMM convolution in exact f32 on the CUDA cores (FFMA), generated for one exact
// shape, for f32 with TF32 off: the GEMM view, gathers and tile end of conv_igemm.cu
// (CONV_COMMON), with tiles kept k-major in shared memory (As[k][m], Bs[k][n], double
// buffered) so each thread reads its TM rows and TN columns of a k-step as whole vectors and
// accumulates a TM x TN block of C in registers. 128 threads: 16 along m, 8 along n.
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
typedef float TA;
typedef float TB;
typedef float TO;

#define MODE ${MODE}
constexpr int N = ${N}, C = ${C}, H = ${H}, W = ${W}, O = ${O}, KH = ${KH}, KW = ${KW};
constexpr int OH = ${OH}, OW = ${OW}, SH = ${SH}, SW = ${SW}, PH = ${PH}, PW = ${PW}, DH = ${DH}, DW = ${DW};
constexpr int G = ${G}, BM = ${BM}, BN = ${BN}, SPLITK = ${SPLITK};
constexpr int THREADS = 128, CLD = BM + 4;
__device__ unsigned int kiln_conv_tiles[${TILES}];
${CONV_COMMON}
constexpr int BK = 8, TM = BM / 16, TN = BN / 8;
constexpr int LDA = BM + 4, LDB = BN + 4;  // rows start 16-byte aligned
constexpr int KT = (GK + BK - 1) / BK, TPS = (KT + SPLITK - 1) / SPLITK;
constexpr int A_PER = BM * BK / THREADS, B_PER = BN * BK / THREADS;
constexpr bool A_MFAST = MODE != 2;  // forward/dgrad A is contiguous along m, wgrad A along k
constexpr int PIPE_BYTES = 2 * BK * (LDA + LDB) * 4, EPI_BYTES = BN * CLD * 4;
constexpr int SMEM = PIPE_BYTES > EPI_BYTES ? PIPE_BYTES : EPI_BYTES;
static_assert(BM % 16 == 0 && BN % 8 == 0 && A_PER >= 1 && B_PER >= 1, "tile too small for 128 threads");

// Where thread `tid`'s i-th element of an R x BK tile sits; "r-fast" runs lanes along rows.
template <bool RFAST, int R>
__device__ __forceinline__ void tile_pos(int tid, int i, int& r, int& k) {
  const int idx = tid + i * THREADS;
  if (RFAST) { r = idx % R; k = idx / R; } else { k = idx % BK; r = idx / BK; }
}

extern "C" __global__ void __launch_bounds__(THREADS) kiln_conv_ffma(const TA* __restrict__ a, const TB* __restrict__ b,
                                                                     TO* __restrict__ out, float* __restrict__ ws) {
  kiln::wait_prior_grids();
  __shared__ __align__(16) unsigned char smem[SMEM];
  float* As = reinterpret_cast<float*>(smem);
  float* Bs = As + 2 * BK * LDA;
  const int tid = threadIdx.x, tm = (tid >> 3) * TM, tn = (tid & 7) * TN;
  const int g = blockIdx.z % G, split = blockIdx.z / G;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  const int kt0 = split * TPS, kt1 = kt0 + TPS < KT ? kt0 + TPS : KT;

  float acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

  float ra[A_PER], rb[B_PER];
  auto gather = [&](int kt) {
    const int kb = kt * BK;
#pragma unroll
    for (int i = 0; i < A_PER; ++i) {
      int r, k;
      tile_pos<A_MFAST, BM>(tid, i, r, k);
      ra[i] = load_a(a, g, m0 + r, kb + k);
    }
#pragma unroll
    for (int i = 0; i < B_PER; ++i) {
      int r, k;
      tile_pos<false, BN>(tid, i, r, k);
      rb[i] = load_b(b, g, kb + k, n0 + r);
    }
  };
  auto park = [&](int buf) {
    float* as = As + buf * BK * LDA;
    float* bs = Bs + buf * BK * LDB;
#pragma unroll
    for (int i = 0; i < A_PER; ++i) {
      int r, k;
      tile_pos<A_MFAST, BM>(tid, i, r, k);
      as[k * LDA + r] = ra[i];
    }
#pragma unroll
    for (int i = 0; i < B_PER; ++i) {
      int r, k;
      tile_pos<false, BN>(tid, i, r, k);
      bs[k * LDB + r] = rb[i];
    }
  };

  if (kt0 < kt1) {
    gather(kt0);
    park(0);
  }
  __syncthreads();
  for (int kt = kt0; kt < kt1; ++kt) {
    const int buf = (kt - kt0) & 1;
    if (kt + 1 < kt1) gather(kt + 1);
    const float* as = As + buf * BK * LDA + tm;
    const float* bs = Bs + buf * BK * LDB + tn;
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      float fa[TM], fb[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) fa[i] = as[k * LDA + i];
#pragma unroll
      for (int j = 0; j < TN; ++j) fb[j] = bs[k * LDB + j];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(fa[i], fb[j], acc[i][j]);
    }
    if (kt + 1 < kt1) park(buf ^ 1);
    __syncthreads();
  }

  float* Cs = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) Cs[(tn + j) * CLD + tm + i] = acc[i][j];
  __syncthreads();
  finish_tile(Cs, out, ws, g, split, m0, n0, tid);
}
