// Implicit-GEMM convolution on tensor cores (mma.sync), generated for one exact shape: every
// size below is a compile-time constant, so index math becomes multiplies and shifts.
// MODE 0 forward  C[m = (img, oy, ox)][n = o]        over k = (c, r, s)
//      1 dgrad    C[m = (img, iy, ix)][n = c]        over k = (o, r, s)
//      2 wgrad    C[m = o][n = (c, r, s)]            over k = (img, oy, ox)
// per group (blockIdx.z % G). Tiles of A (BM x BK) and B (BN x BK) are gathered from NCHW
// global memory into registers, converted to the MMA type and kept k-contiguous in shared
// memory (double buffered); accumulation is f32. SPLITK > 1 splits k across blockIdx.z / G:
// each block parks its f32 tile in `ws` and the last block of a tile sums them in split order
// (deterministic, no float atomics) and resets the tile's counter for the next launch.
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
typedef ${TA} TA;  // A's storage type (x, or gy for dgrad and wgrad)
typedef ${TB} TB;  // B's storage type (w, or x for wgrad)
typedef ${TO} TO;  // the output's storage type

#define MODE ${MODE}
#define MMA ${MMA}  // 0 bf16, 1 f16, 2 tf32
${MMA_OPS}
typedef MmaT MT;
constexpr int N = ${N}, C = ${C}, H = ${H}, W = ${W}, O = ${O}, KH = ${KH}, KW = ${KW};
constexpr int OH = ${OH}, OW = ${OW}, SH = ${SH}, SW = ${SW}, PH = ${PH}, PW = ${PW}, DH = ${DH}, DW = ${DW};
constexpr int G = ${G}, BM = ${BM}, BN = ${BN}, SPLITK = ${SPLITK};
constexpr int THREADS = 128, CLD = BM + 4;
__device__ unsigned int kiln_conv_tiles[${TILES}];
${CONV_COMMON}
constexpr int KSTEP = MMA == 2 ? 8 : 16, BK = MMA == 2 ? 16 : 32, PAD = MMA == 2 ? 4 : 8;
constexpr int LD = BK + PAD;  // rows padded so fragment reads miss bank conflicts
constexpr int WTM = BM / 2, WTN = BN / 2, MI = WTM / 16, NI = WTN / 8;
constexpr int KT = (GK + BK - 1) / BK, TPS = (KT + SPLITK - 1) / SPLITK;
constexpr int A_PER = BM * BK / THREADS, B_PER = BN * BK / THREADS;
constexpr bool A_MFAST = MODE != 2;  // forward/dgrad A is contiguous along m, wgrad A along k
constexpr int PIPE_BYTES = 2 * (BM + BN) * LD * (int)sizeof(MT), EPI_BYTES = BN * CLD * 4;
constexpr int SMEM = PIPE_BYTES > EPI_BYTES ? PIPE_BYTES : EPI_BYTES;

__device__ __forceinline__ unsigned int lds32(const MT* p) { return *reinterpret_cast<const unsigned int*>(p); }

// Fragment registers of the k-step at column k0 (mma.sync's row.col operand layouts).
__device__ __forceinline__ void frag_a(unsigned int* a, const MT* As, int row, int k0, int t) {
#if MMA == 2
  a[0] = __float_as_uint(As[row * LD + k0 + t]);
  a[1] = __float_as_uint(As[(row + 8) * LD + k0 + t]);
  a[2] = __float_as_uint(As[row * LD + k0 + t + 4]);
  a[3] = __float_as_uint(As[(row + 8) * LD + k0 + t + 4]);
#else
  a[0] = lds32(As + row * LD + k0 + 2 * t);
  a[1] = lds32(As + (row + 8) * LD + k0 + 2 * t);
  a[2] = lds32(As + row * LD + k0 + 2 * t + 8);
  a[3] = lds32(As + (row + 8) * LD + k0 + 2 * t + 8);
#endif
}

__device__ __forceinline__ void frag_b(unsigned int* b, const MT* Bs, int col, int k0, int t) {
#if MMA == 2
  b[0] = __float_as_uint(Bs[col * LD + k0 + t]);
  b[1] = __float_as_uint(Bs[col * LD + k0 + t + 4]);
#else
  b[0] = lds32(Bs + col * LD + k0 + 2 * t);
  b[1] = lds32(Bs + col * LD + k0 + 2 * t + 8);
#endif
}

// Where thread `tid`'s i-th element of an R x BK tile sits; "m-fast" runs lanes along rows.
template <bool MFAST, int R>
__device__ __forceinline__ void tile_pos(int tid, int i, int& r, int& k) {
  const int idx = tid + i * THREADS;
  if (MFAST) { r = idx % R; k = idx / R; } else { k = idx % BK; r = idx / BK; }
}

extern "C" __global__ void __launch_bounds__(THREADS) kiln_conv_igemm(const TA* __restrict__ a, const TB* __restrict__ b,
                                                                      TO* __restrict__ out, float* __restrict__ ws) {
  kiln::wait_prior_grids();
  __shared__ __align__(16) unsigned char smem[SMEM];
  MT* As = reinterpret_cast<MT*>(smem);
  MT* Bs = As + 2 * BM * LD;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, t = lane & 3;
  const int wm = (warp >> 1) * WTM, wn = (warp & 1) * WTN;
  const int g = blockIdx.z % G, split = blockIdx.z / G;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  const int kt0 = split * TPS, kt1 = kt0 + TPS < KT ? kt0 + TPS : KT;

  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;

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
    MT* as = As + buf * BM * LD;
    MT* bs = Bs + buf * BN * LD;
#pragma unroll
    for (int i = 0; i < A_PER; ++i) {
      int r, k;
      tile_pos<A_MFAST, BM>(tid, i, r, k);
      as[r * LD + k] = to_mt(ra[i]);
    }
#pragma unroll
    for (int i = 0; i < B_PER; ++i) {
      int r, k;
      tile_pos<false, BN>(tid, i, r, k);
      bs[r * LD + k] = to_mt(rb[i]);
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
    const MT* as = As + buf * BM * LD;
    const MT* bs = Bs + buf * BN * LD;
#pragma unroll
    for (int k0 = 0; k0 < BK; k0 += KSTEP) {
      unsigned int fa[MI][4], fb[NI][2];
#pragma unroll
      for (int i = 0; i < MI; ++i) frag_a(fa[i], as, wm + i * 16 + gq, k0, t);
#pragma unroll
      for (int j = 0; j < NI; ++j) frag_b(fb[j], bs, wn + j * 8 + gq, k0, t);
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) mma(acc[i][j], fa[i], fb[j]);
    }
    if (kt + 1 < kt1) park(buf ^ 1);
    __syncthreads();
  }

  // The tile goes through shared memory as Cs[n][m], so global stores run along the
  // contiguous dimension (m for forward/dgrad, n for wgrad).
  float* Cs = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int m = wm + i * 16 + gq + (q >> 1) * 8, n = wn + j * 8 + 2 * t + (q & 1);
        Cs[n * CLD + m] = acc[i][j][q];
      }
  __syncthreads();

  finish_tile(Cs, out, ws, g, split, m0, n0, tid);
}
