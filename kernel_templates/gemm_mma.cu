// GEMM on mma.sync for sm_80 and later (sm_80, sm_86, sm_89 have no warpgroup MMA or TMA),
// generated per exact shape: for each of BATCH problems, D (M x N, rows LDD apart) = A (M x K) @
// B (N x K)^T with f32 sums and the built-in epilogue (+ bias[column], then ReLU) on each sum.
// A block computes a BM x BN tile with warps of 64 x 32; STAGES stages of cp.async copies (16
// bytes a thread, zero-filled past the matrix) run ahead of the MMAs. K-major tiles hold rows
// of 128 bytes of k; MN-major ones (16-bit) rows of BM or BN elements, one per k. Fragments come
// through ldmatrix (.trans for MN-major), each 16-byte chunk of a row stored at its index XOR the
// row's low 3 bits, so the eight rows one ldmatrix reads fall in distinct banks. TF32 reads
// 32-bit elements as pairs of 16-bit ones: an 8 x 8 ldmatrix block is 8 rows of 4 of them.
// Exact f32 (SPLIT) splits each fragment element in registers, x = hi + lo (both TF32), and sums
// hi*hi + lo*hi + hi*lo; the cross products take hi as 0 where x is not finite (and lo is 0
// there), so an inf or NaN reaches the sum through hi*hi alone, as FFMA's product would.
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
#define MMA ${MMA}
${MMA_OPS}
namespace {

using In = ${IN};
constexpr int kBM = ${BM}, kBN = ${BN}, kStages = ${STAGES}, kEpilogue = ${EPILOGUE};  // 1 + bias, 2 ReLU after
constexpr long long kM = ${M}, kN = ${N}, kK = ${K}, kLda = ${LDA}, kLdb = ${LDB}, kLdd = ${LDD};
constexpr long long kBatchA = ${BATCH_A}, kBatchB = ${BATCH_B}, kBatchD = ${BATCH_D};
constexpr bool kAMn = ${A_MN}, kBMn = ${B_MN}, kSplit = ${SPLIT};
constexpr int kChunk = 16 / sizeof(In);  // elements per 16-byte chunk
constexpr int kBK = 8 * kChunk;          // k per stage: 128 bytes of a row
constexpr int kKStep = 2 * kChunk;       // k per MMA: 32 bytes (16 halves, 8 tf32)
constexpr int kWarpsN = kBN / 32, kThreads = (kBM / 64) * kWarpsN * 32;
constexpr int kATile = kBM * kBK, kBTile = kBN * kBK;  // elements of a stage
constexpr int kKTiles = static_cast<int>((kK + kBK - 1) / kBK);

// Element offset of chunk c of row r in a tile whose rows hold `width` elements.
template <int width>
__device__ __forceinline__ int at(int r, int c) {
  return r * width + ((c ^ (r & 7)) * kChunk);
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void copy16(In* dst, const In* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}

template <bool trans>
__device__ __forceinline__ void ldsm4(unsigned* r, const In* p) {
  if constexpr (trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ float tf32_round(float x) {
  unsigned u;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(x));
  return __uint_as_float(u);
}

// Fragment registers x as hi, lo and hf (hi, or 0 where x is not finite). A finite x that
// rounds past the largest float keeps its truncation as hi.
template <int n>
__device__ __forceinline__ void split(const unsigned* x, unsigned* hi, unsigned* lo, unsigned* hf) {
#pragma unroll
  for (int i = 0; i < n; ++i) {
    const float v = __uint_as_float(x[i]);
    const bool finite = isfinite(v);
    float h = tf32_round(v);
    h = finite && !isfinite(h) ? __uint_as_float(x[i] & 0xffffe000u) : h;
    hi[i] = __float_as_uint(h);
    lo[i] = __float_as_uint(finite ? tf32_round(v - h) : 0.f);
    hf[i] = __float_as_uint(finite ? h : 0.f);
  }
}

// One operand's tile of k tile kt into shared memory: `rows` rows (M or N) of k, K-major rows of
// kBK or MN-major rows of `rows`; out-of-range chunks are zero-filled.
template <int rows, bool mn>
__device__ __forceinline__ void load_tile(In* s, const In* g, long long ld, long long extent, long long r0, int kt) {
  constexpr int per_row = mn ? rows / kChunk : kBK / kChunk, chunks = (mn ? kBK : rows) * per_row;
  const long long k0 = static_cast<long long>(kt) * kBK;
  for (int i = threadIdx.x; i < chunks; i += kThreads) {
    const int r = i / per_row, c = i % per_row;
    // K-major: row r0 + r, k from k0 + c * kChunk; MN-major: k row k0 + r, from r0 + c * kChunk.
    const long long row = mn ? k0 + r : r0 + r, col = mn ? r0 + c * kChunk : k0 + c * kChunk;
    const bool valid = mn ? row < kK && col < extent : row < extent && col < kK;
    copy16(s + at<mn ? rows : kBK>(r, c), valid ? g + row * ld + col : g, valid);
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads)
kiln_gemm_mma(const In* __restrict__ a, const In* __restrict__ b, In* __restrict__ d, const In* __restrict__ bias) {
  kiln::wait_prior_grids();
  extern __shared__ __align__(128) unsigned char smem_raw[];
  In* smem = reinterpret_cast<In*>(smem_raw);
  const long long z = blockIdx.z, m0 = static_cast<long long>(blockIdx.y) * kBM,
                  n0 = static_cast<long long>(blockIdx.x) * kBN;
  a += z * kBatchA, b += z * kBatchB, d += z * kBatchD;
  auto load = [&](int kt) {
    In* s = smem + (kt % kStages) * (kATile + kBTile);
    load_tile<kBM, kAMn>(s, a, kLda, kM, m0, kt);
    load_tile<kBN, kBMn>(s + kATile, b, kLdb, kN, n0, kt);
  };
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < kKTiles) load(s);
    asm volatile("cp.async.commit_group;");
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wm = (warp / kWarpsN) * 64, wn = (warp % kWarpsN) * 32;
  const int j = lane / 8, rr = lane % 8;  // which 8 x 8 block this lane addresses, and its row
  float acc[4][4][4] = {};
  for (int kt = 0; kt < kKTiles; ++kt) {
    asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 2));
    __syncthreads();  // tile kt has landed everywhere; every warp is done with tile kt - 1's stage
    if (kt + kStages - 1 < kKTiles) load(kt + kStages - 1);
    asm volatile("cp.async.commit_group;");
    const In* as = smem + (kt % kStages) * (kATile + kBTile);
    const In* bs = as + kATile;
#pragma unroll
    for (int ks = 0; ks < kBK / kKStep; ++ks) {
      const int kc = ks * 2;  // the k step's first chunk
      unsigned fa[4][4], fb[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int m = wm + i * 16;
        if constexpr (kAMn)  // blocks (k, m): (0-7, 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15)
          ldsm4<true>(fa[i], as + at<kBM>(kc * kChunk + rr + 8 * (j >> 1), m / kChunk + (j & 1)));
        else  // blocks (m, k): rows 0-7 and 8-15 of the first chunk, then of the second
          ldsm4<false>(fa[i], as + at<kBK>(m + rr + 8 * (j & 1), kc + (j >> 1)));
      }
#pragma unroll
      for (int p = 0; p < 2; ++p) {  // two n8 tiles at a time: b[2p][0..1], b[2p+1][0..1]
        const int n = wn + p * 16;
        unsigned r[4];
        if constexpr (kBMn)
          ldsm4<true>(r, bs + at<kBN>(kc * kChunk + rr + 8 * (j & 1), n / kChunk + (j >> 1)));
        else
          ldsm4<false>(r, bs + at<kBK>(n + rr + 8 * (j >> 1), kc + (j & 1)));
        fb[2 * p][0] = r[0], fb[2 * p][1] = r[1], fb[2 * p + 1][0] = r[2], fb[2 * p + 1][1] = r[3];
      }
      if constexpr (kSplit) {
        unsigned ah[4][4], al[4][4], af[4][4], bh[4][2], bl[4][2], bf[4][2];
#pragma unroll
        for (int i = 0; i < 4; ++i) split<4>(fa[i], ah[i], al[i], af[i]);
#pragma unroll
        for (int t = 0; t < 4; ++t) split<2>(fb[t], bh[t], bl[t], bf[t]);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int t = 0; t < 4; ++t) {
            mma(acc[i][t], ah[i], bh[t]);
            mma(acc[i][t], al[i], bf[t]);
            mma(acc[i][t], af[i], bl[t]);
          }
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int t = 0; t < 4; ++t) mma(acc[i][t], fa[i], fb[t]);
      }
    }
  }
  asm volatile("cp.async.wait_group 0;");
  // acc[i][t]: rows g and g + 8 of m16 tile i, columns 2q and 2q + 1 of n8 tile t.
  const int g = lane / 4, q = lane % 4;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const long long row = m0 + wm + i * 16 + g + 8 * (e / 2), col = n0 + wn + t * 8 + 2 * q + e % 2;
        if (row >= kM || col >= kN) continue;
        float v = acc[i][t][e];
        if constexpr (kEpilogue >= 1) v += kiln::cvt<float>(bias[col]);
        if constexpr (kEpilogue == 2) v = kiln::math::relu(v);
        d[row * kLdd + col] = kiln::cvt<In>(v);
      }
}
