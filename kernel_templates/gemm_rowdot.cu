// GEMM for D of at most 32 columns (an output layer's logits), generated per exact shape: a warp
// per row of D, on the CUDA cores with f32 sums. D (M x N, rows LDD apart) = A (M x K) @ B (N x K)^T,
// A and B K-major, with the built-in epilogue (+ bias[column], then ReLU), rounded once to D's
// dtype (the inputs'). Each lane sums its slices of k for every column (16 bytes a load where the
// rows allow: VEC elements), then the warp adds its lanes' sums by a butterfly, so every lane holds
// the same bits and the product is one kernel with no partials in memory: the tiled kinds split k
// among blocks to fill the SMs on such shapes and add the splits after. With
// KILN_ROWDOT_CROSS_ENTROPY the module follows softmax.cu's cross-entropy rows (which state the
// wait line) and holds the fused kernel below instead; with KILN_ROWDOT_INPUT_GRAD it holds the
// product's input gradient masked for the ReLU that made A. (clang-format would join the
// placeholders' lines.)
// clang-format off
${PRELUDE}
#ifndef KILN_ROWDOT_CROSS_ENTROPY
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
#endif
namespace {

using In = ${IN};
constexpr int kWarps = ${BM}, kEpilogue = ${EPILOGUE};  // rows a block; 1 + bias, 2 ReLU after
constexpr long long kM = ${M}, kK = ${K}, kLda = ${LDA}, kLdb = ${LDB}, kLdd = ${LDD};
constexpr int kN = ${N};
constexpr int kVec = ${VEC};  // elements a lane loads at once: 16 bytes' worth, or 1
static_assert(kN >= 1 && kN <= 32 && ${BN} == kN, "a lane stores one column");
static_assert(!${A_MN} && !${B_MN}, "both operands K-major");

// kVec elements at p (16-byte aligned where kVec > 1), as floats.
__device__ __forceinline__ void load(const In* __restrict__ p, float (&v)[kVec]) {
  if constexpr (kVec == 1) {
    v[0] = kiln::cvt<float>(*p);
  } else if constexpr (sizeof(In) == 4) {
    const float4 f = __ldg(reinterpret_cast<const float4*>(p));
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
    const In* h = reinterpret_cast<const In*>(&u);
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] = kiln::cvt<float>(h[j]);
  }
}

// Row m of D (every lane of the warp calls it): each lane's sums, the warp's butterfly, then lane
// n < kN stores column n.
__device__ __forceinline__ void store_row(const In* __restrict__ a, const In* __restrict__ b, In* d,
                                          const In* __restrict__ bias, long long m, int lane) {
  const In* x = a + m * kLda;
  float acc[kN];
#pragma unroll
  for (int n = 0; n < kN; ++n) acc[n] = 0.f;
#pragma unroll 4
  for (long long k = lane * kVec; k < kK; k += 32 * kVec) {
    float xv[kVec];
    load(x + k, xv);
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      float wv[kVec];
      load(b + n * kLdb + k, wv);
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc[n] = fmaf(xv[j], wv[j], acc[n]);
    }
  }
  // Lanes l and l ^ o add the same two sums (a + b == b + a), so all end with the same bits.
  float v = 0.f;
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[n] += __shfl_xor_sync(0xffffffffu, acc[n], o);
    if (lane == n) v = acc[n];
  }
  if (lane >= kN) return;
  if (kEpilogue >= 1) v += kiln::cvt<float>(bias[lane]);
  if (kEpilogue == 2) v = kiln::math::relu(v);
  kiln::store(d + m * kLdd + lane, v);
}

// Row m of the input gradient dx (M x K, dense) = g (M x kN, dense) @ B where A > 0, else 0: A
// is a ReLU's output and g the gradient of D. Each lane takes the slices of k it loads in
// store_row and sums over n in order, so both kernels that write it (below) give the same bits.
__device__ __forceinline__ void masked_input_grad_row(const In* g, const In* __restrict__ b, const In* __restrict__ a,
                                                      In* __restrict__ dx, long long m, int lane) {
  float gv[kN];
#pragma unroll
  for (int n = 0; n < kN; ++n) gv[n] = kiln::cvt<float>(g[m * kN + n]);
  const In* y = a + m * kLda;
  In* out = dx + m * kK;
  // Unrolled whole, so that every slice's loads are in flight at once: the loop sits on the
  // backward's chain, and its time is the loads' latency.
  constexpr int kSlices = static_cast<int>((kK + 32 * kVec - 1) / (32 * kVec));
#pragma unroll
  for (int slice = 0; slice < kSlices; ++slice) {
    const long long k = (static_cast<long long>(slice) * 32 + lane) * kVec;
    if (k >= kK) break;
    float acc[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc[j] = 0.f;
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      float wv[kVec];
      load(b + n * kLdb + k, wv);
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc[j] = fmaf(gv[n], wv[j], acc[j]);
    }
    float yv[kVec];
    load(y + k, yv);
#pragma unroll
    for (int j = 0; j < kVec; ++j) kiln::store(out + k + j, yv[j] > 0.f ? acc[j] : 0.f);
  }
}

}  // namespace

#if defined(KILN_ROWDOT_INPUT_GRAD)
extern "C" __global__ void __launch_bounds__(kWarps * 32)
kiln_gemm_rowdot_input_grad(const In* __restrict__ g, const In* __restrict__ b, const In* __restrict__ a,
                            In* __restrict__ dx) {
  kiln::wait_prior_grids();
  const long long m = static_cast<long long>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (m >= kM) return;
  masked_input_grad_row(g, b, a, dx, m, threadIdx.x & 31);
}
#elif !defined(KILN_ROWDOT_CROSS_ENTROPY)
extern "C" __global__ void __launch_bounds__(kWarps * 32)
kiln_gemm_rowdot(const In* __restrict__ a, const In* __restrict__ b, In* __restrict__ d, const In* __restrict__ bias) {
  kiln::wait_prior_grids();
  const long long m = static_cast<long long>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (m >= kM) return;  // the whole warp: no shuffle misses a lane
  store_row(a, b, d, bias, m, threadIdx.x & 31);
}
#else
// The product and the softmax cross-entropy of its rows (logits d, rows of kN) in one kernel: a
// warp per row, as kiln_softmax_cross_entropy runs at width 32, writes its row's logits as
// kiln_gemm_rowdot does (the same bits) and reads them back (__syncwarp orders a warp's global
// writes before its reads), so the loss, statistics and gradient are those of the two kernels.
// With masked_dx (and unit_dx), each warp then reads its row's unit_dx back and writes the row
// of the input gradient masked for the ReLU that made A, as kiln_gemm_rowdot_input_grad does.
extern "C" __global__ void __launch_bounds__(kBlock)
kiln_gemm_rowdot_cross_entropy(const In* __restrict__ a, const In* __restrict__ b, In* d, const In* __restrict__ bias,
                               const long long* __restrict__ labels, Loss* __restrict__ out, Acc* rows,
                               Acc* __restrict__ stats, T* unit_dx, int reduction, double smoothing,
                               long long ignore, int has_ignore, In* __restrict__ masked_dx) {
  kiln::wait_prior_grids();
  cross_entropy_rows(d, labels, out, rows, stats, unit_dx, kM, kN, 32, reduction, smoothing, ignore, has_ignore,
                     [&](long long r, bool live, int lane) {
                       if (live) store_row(a, b, d, bias, r, lane);
                       __syncwarp();
                     },
                     [&](long long r, int lane) {
                       if (!masked_dx) return;
                       __syncwarp();
                       masked_input_grad_row(unit_dx, b, a, masked_dx, r, lane);
                     });
}
#endif
// clang-format on
