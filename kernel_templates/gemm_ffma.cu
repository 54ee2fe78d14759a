// GEMM on the CUDA cores (FFMA), generated per exact shape, for the small products where the
// tensor cores' tiles cost more than they save: exact f32 (whose tensor-core form splits every
// operand into three TF32 products), and 16-bit inputs whose k is short or whose rows are odd
// (which TMA cannot read). D (M x N, rows LDD apart) = A (M x K) @ B (N x K)^T with f32 sums,
// rounded once to D's dtype (the inputs'), with the built-in epilogue (+ bias[column], then
// ReLU). A and B are K-major (rows of k) or MN-major (rows of m or n, one per k). A block
// computes a BM x BN tile, each thread 4 x 4 sums in registers. kStages tiles of BK k are in
// flight as cp.async copies of 4 elements where rows allow (VEC_A/VEC_B; zero-filled past the
// matrix; odd 16-bit rows are copied by plain loads) into shared memory laid out as stored: a
// K-major tile as rows of k, an MN-major one as rows of m or n. A thread's rows of a K-major
// tile are 4 apart by BM/4 (BN/4), so a warp's vector reads of them fall in distinct banks; of
// an MN-major tile, 4 side by side, read as one vector. With SPLITK > 1 the k tiles are split
// among blocks: each parks its partial tile in f32, and the last of a tile's blocks adds them
// in split order (the same bits every run) and applies the epilogue, so the product is one
// kernel. With CLUSTER (sm_90) a tile's SPLITK blocks are one thread-block cluster instead:
// each leaves its partial tile in its shared memory, and each adds a slice of the tile's
// elements over every block's, read through distributed shared memory in split order (the
// same sums as the parked partials, with no round trip through global memory). An epilogue
// hook (gemm_hooks.h: a pointwise expression of the sum and its extra operands, such as a
// ReLU's mask) may stand in for the built-in epilogue. (clang-format would join the
// placeholders' lines.)
// clang-format off
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
namespace {

using In = ${IN};
constexpr int kBM = ${BM}, kBN = ${BN}, kSplitK = ${SPLITK}, kEpilogue = ${EPILOGUE};  // 1 + bias, 2 ReLU after
constexpr bool kCluster = ${CLUSTER};
constexpr long long kM = ${M}, kN = ${N}, kK = ${K}, kLda = ${LDA}, kLdb = ${LDB}, kLdd = ${LDD};
constexpr bool kAMn = ${A_MN}, kBMn = ${B_MN};
constexpr int kVecA = ${VEC_A}, kVecB = ${VEC_B};  // elements a copy moves: 4 or 1
constexpr int kBK = 16, kStages = 4;
constexpr int kThreadsM = kBM / 4, kThreadsN = kBN / 4, kThreads = kThreadsM * kThreadsN;
constexpr int kKTiles = static_cast<int>((kK + kBK - 1) / kBK);
constexpr int kTilesPerSplit = (kKTiles + kSplitK - 1) / kSplitK;
static_assert(kThreads >= 32 && kThreads <= 256 && kThreads % 32 == 0, "tile needs whole warps");
static_assert(!kCluster || (kSplitK >= 2 && kSplitK <= 8), "a cluster holds a tile's 2 to 8 splits");
#if ${CLUSTER}
#define KILN_FFMA_CLUSTER __cluster_dims__(1, 1, ${SPLITK})
#else
#define KILN_FFMA_CLUSTER
#endif

__device__ unsigned int kiln_gemm_ffma_done[${TILES}];

// The epilogue hook's operands, as the host lays them out.
struct HookPointers {
  const void* epi[6];
  const void* pro[6];
};

template <class T>
__device__ __forceinline__ float hook_load(const void* p, long long i) {
  return kiln::cvt<float>(static_cast<const T*>(p)[i]);
}

${HOOK_FUNCTIONS}  // per tile: splits parked (reset by the last)

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// kVec elements from src to dst (zeros where !valid): asynchronously where cp.async moves that
// many bytes (4, 8 or 16), else by a plain load and store.
template <int kVec>
__device__ __forceinline__ void copy_async(In* dst, const In* src, bool valid) {
  constexpr int kBytes = kVec * static_cast<int>(sizeof(In));
  if constexpr (kBytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0));
  else if constexpr (kBytes == 8)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 8 : 0));
  else if constexpr (kBytes == 4)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0));
  else
    *dst = valid ? *src : kiln::cvt<In>(0.f);
}

// Four elements side by side in shared memory (8- or 16-byte aligned), as floats.
__device__ __forceinline__ void read4(const In* p, float& a, float& b, float& c, float& d) {
  if constexpr (sizeof(In) == 4) {
    const float4 f = *reinterpret_cast<const float4*>(p);
    a = f.x, b = f.y, c = f.z, d = f.w;
  } else {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const In* h = reinterpret_cast<const In*>(&u);
    a = kiln::cvt<float>(h[0]), b = kiln::cvt<float>(h[1]), c = kiln::cvt<float>(h[2]), d = kiln::cvt<float>(h[3]);
  }
}

// One operand: kR rows (m or n) of a kBK tile, stored as the matrix is (K-major: kR rows of kBK
// k; MN-major: kBK rows of kR), rows padded by 4 elements.
template <int kR, bool kMn, int kVec, long long kRows, long long kLd>
struct Operand {
  static constexpr int kLds = (kMn ? kR : kBK) + 4;
  static constexpr int kElements = (kMn ? kBK : kR) * kLds;  // of a stage
  static constexpr int kCopies = kR * kBK / kVec;

  // Queues k tile kt's copies into stage s.
  __device__ __forceinline__ static void copy(In* s, const In* __restrict__ x, long long r0, int kt, int tid) {
    const long long k0 = static_cast<long long>(kt) * kBK;
    for (int idx = tid; idx < kCopies; idx += kThreads) {
      int r, k;
      if constexpr (kMn) {
        k = idx / (kR / kVec), r = idx % (kR / kVec) * kVec;
      } else {
        r = idx / (kBK / kVec), k = idx % (kBK / kVec) * kVec;
      }
      const long long row = r0 + r, kk = k0 + k;
      const bool in = row < kRows && kk < kK;
      const In* src = in ? x + (kMn ? kk * kLd + row : row * kLd + kk) : x;
      copy_async<kVec>(s + (kMn ? k * kLds + r : r * kLds + k), src, in);
    }
  }

  // The thread's 4 rows (t: its index along them) at k = kk..kk+3: v[i][q] is row i at k kk + q.
  __device__ __forceinline__ static void read(const In* s, int t, int kk, float (&v)[4][4]) {
    if constexpr (kMn) {
#pragma unroll
      for (int q = 0; q < 4; ++q) read4(s + (kk + q) * kLds + t * 4, v[0][q], v[1][q], v[2][q], v[3][q]);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) read4(s + (t + i * (kR / 4)) * kLds + kk, v[i][0], v[i][1], v[i][2], v[i][3]);
    }
  }

  // The tile row of the thread's i-th row.
  __device__ __forceinline__ static int row(int t, int i) { return kMn ? t * 4 + i : t + i * (kR / 4); }
};

using OperandA = Operand<kBM, kAMn, kVecA, kM, kLda>;
using OperandB = Operand<kBN, kBMn, kVecB, kN, kLdb>;

__device__ __forceinline__ void store(In* __restrict__ d, const In* __restrict__ bias, long long m, long long n, float v,
                                      const HookPointers& hp) {
  if (m >= kM || n >= kN) return;
  if (kEpilogue >= 1) v += kiln::cvt<float>(bias[n]);
  if (kEpilogue == 2) v = kiln::math::relu(v);
  v = epilogue(v, m, n, 0, hp);  // the hook's value, or v without one
  kiln::store(d + m * kLdd + n, v);
}

// A cluster's blocks add their partial tiles (`mine`, rows of kBN in shared memory; block r of
// the cluster is split r): each block the elements [E r / S, E (r + 1) / S) of E, starting from
// split 0's and adding the others' in split order, as the parked partials are added.
__device__ __forceinline__ void add_cluster_partials(const float* mine, In* __restrict__ d, const In* __restrict__ bias,
                                                     long long m0, long long n0, const HookPointers& hp) {
  constexpr int kElems = kBM * kBN;
  const unsigned rank = blockIdx.z, local = smem_addr(mine);
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
  const int first = static_cast<int>(static_cast<long long>(kElems) * rank / kSplitK);
  const int end = static_cast<int>(static_cast<long long>(kElems) * (rank + 1) / kSplitK);
  for (int e = first + threadIdx.x; e < end; e += kThreads) {
    float v[kSplitK];
#pragma unroll
    for (int s = 0; s < kSplitK; ++s) {
      unsigned remote;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local + 4u * e), "r"(s));
      asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v[s]) : "r"(remote) : "memory");
    }
    float sum = v[0];
#pragma unroll
    for (int s = 1; s < kSplitK; ++s) sum += v[s];
    store(d, bias, m0 + e / kBN, n0 + e % kBN, sum, hp);
  }
  // No block leaves while another may still read its partial tile.
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

}  // namespace

// The stages' operand tiles, and in a cluster the partial tile after them (the same bytes).
constexpr int kStageBytes = kStages * (OperandA::kElements + OperandB::kElements) * static_cast<int>(sizeof(In));
constexpr int kSharedBytes = kCluster && kBM * kBN * 4 > kStageBytes ? kBM * kBN * 4 : kStageBytes;

extern "C" __global__ void KILN_FFMA_CLUSTER __launch_bounds__(kThreads)
kiln_gemm_ffma(const In* __restrict__ a, const In* __restrict__ b, In* __restrict__ d, const In* __restrict__ bias,
               float* __restrict__ parts, const __grid_constant__ HookPointers hp) {
  kiln::wait_prior_grids();
  __shared__ __align__(16) unsigned char smem[kSharedBytes];
  auto* as = reinterpret_cast<In(*)[OperandA::kElements]>(smem);
  auto* bs = reinterpret_cast<In(*)[OperandB::kElements]>(smem + kStages * OperandA::kElements * sizeof(In));
  const int tid = threadIdx.x, ty = tid / kThreadsN, tx = tid % kThreadsN;
  const long long m0 = static_cast<long long>(blockIdx.y) * kBM, n0 = static_cast<long long>(blockIdx.x) * kBN;
  const int split = blockIdx.z;
  const int kt0 = split * kTilesPerSplit, kt1 = kt0 + kTilesPerSplit < kKTiles ? kt0 + kTilesPerSplit : kKTiles;

  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;

  // kStages - 1 tiles in flight ahead of the one computed; a group per tile, empty past the end.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (kt0 + s < kt1) {
      OperandA::copy(as[s], a, m0, kt0 + s, tid);
      OperandB::copy(bs[s], b, n0, kt0 + s, tid);
    }
    asm volatile("cp.async.commit_group;");
  }
  for (int kt = kt0; kt < kt1; ++kt) {
    asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 2));
    __syncthreads();  // tile kt landed for every thread; the stage refilled below was read by all
    const int ahead = kt + kStages - 1, slot = (ahead - kt0) % kStages;
    if (ahead < kt1) {
      OperandA::copy(as[slot], a, m0, ahead, tid);
      OperandB::copy(bs[slot], b, n0, ahead, tid);
    }
    asm volatile("cp.async.commit_group;");
    const In* sa = as[(kt - kt0) % kStages];
    const In* sb = bs[(kt - kt0) % kStages];
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 4) {
      float fa[4][4], fb[4][4];
      OperandA::read(sa, ty, kk, fa);
      OperandB::read(sb, tx, kk, fb);
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(fa[i][q], fb[j][q], acc[i][j]);
    }
  }
  asm volatile("cp.async.wait_group 0;");

  if constexpr (kCluster) {
    kiln::launch_dependents();
    __syncthreads();  // every thread's last reads of the stages are done: the tile takes their bytes
    float* mine = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) mine[OperandA::row(ty, i) * kBN + OperandB::row(tx, j)] = acc[i][j];
    add_cluster_partials(mine, d, bias, m0, n0, hp);
    return;
  }
  if (kSplitK == 1) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) store(d, bias, m0 + OperandA::row(ty, i), n0 + OperandB::row(tx, j), acc[i][j], hp);
    return;
  }
  // Each split parks its tile; the last to finish adds all of them in split order.
  const int tile = blockIdx.y * gridDim.x + blockIdx.x;
  const long long tile_floats = static_cast<long long>(kBM) * kBN, stride = tile_floats * gridDim.x * gridDim.y;
  float* mine = parts + split * stride + tile * tile_floats;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) mine[OperandA::row(ty, i) * kBN + OperandB::row(tx, j)] = acc[i][j];
  if (!kiln::block::last_of(&kiln_gemm_ffma_done[tile], kSplitK)) return;
  kiln::launch_dependents();
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const long long at = tile * tile_floats + OperandA::row(ty, i) * kBN + OperandB::row(tx, j);
      float sum = __ldcg(parts + at);
      for (int s = 1; s < kSplitK; ++s) sum += __ldcg(parts + s * stride + at);
      store(d, bias, m0 + OperandA::row(ty, i), n0 + OperandB::row(tx, j), sum, hp);
    }
}
// clang-format on
