// softmax / log_softmax over contiguous rows [rows, C], and the gather/scatter kernels of
// nll_loss. One module per dtype holds every entry; T is the storage type, Acc the compute
// type (float for f16/bf16/f32, double for f64). NVRTC -std=c++17, no C++ library.
${PRELUDE}
typedef ${T} T;
typedef ${ACC} Acc;

namespace ks {

__device__ __forceinline__ Acc to_acc(float v) { return v; }
__device__ __forceinline__ Acc to_acc(double v) { return static_cast<Acc>(v); }
#ifdef __CUDA_FP16_H__
__device__ __forceinline__ Acc to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ void store(__half* p, Acc v) { *p = __float2half_rn(static_cast<float>(v)); }
#endif
#ifdef __CUDA_BF16_H__
__device__ __forceinline__ Acc to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void store(__nv_bfloat16* p, Acc v) { *p = __float2bfloat16_rn(static_cast<float>(v)); }
#endif
__device__ __forceinline__ void store(float* p, Acc v) { *p = static_cast<float>(v); }
__device__ __forceinline__ void store(double* p, Acc v) { *p = static_cast<double>(v); }

__device__ __forceinline__ float exp_(float x) { return expf(x); }
__device__ __forceinline__ double exp_(double x) { return exp(x); }
__device__ __forceinline__ float log_(float x) { return logf(x); }
__device__ __forceinline__ double log_(double x) { return log(x); }
__device__ __forceinline__ Acc max_(Acc a, Acc b) { return a != a || a > b ? a : b; }  // NaN wins
__device__ __forceinline__ Acc nan_() { return Acc(0) / Acc(0); }
__device__ __forceinline__ Acc neg_inf() { return -Acc(1) / Acc(0); }

constexpr int kBlock = 256;  // the launcher always launches 256 threads

// Reduces v over `width` lanes (32: a warp; kBlock: the whole block). Every lane of the
// group receives the result.
template <bool kMax>
__device__ Acc group_reduce(Acc v, int width) {
  for (int d = 16; d > 0; d /= 2) {
    const Acc o = __shfl_xor_sync(0xffffffffu, v, d);
    v = kMax ? max_(v, o) : v + o;
  }
  if (width == 32) return v;
  __shared__ Acc part[kBlock / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = part[0];
  for (int w = 1; w < kBlock / 32; ++w) v = kMax ? max_(v, part[w]) : v + part[w];
  __syncthreads();  // part is reused by the next reduction
  return v;
}

}  // namespace ks

// out[r, :] = softmax(in[r, :]) (log_mode: log_softmax). width 32: a warp per row, eight
// rows per block; width 256: a block per row. Rows loop grid-stride.
extern "C" __global__ void kiln_softmax(const T* __restrict__ in, T* __restrict__ out, long long rows, long long C,
                                        int width, int log_mode) {
  const int per_block = ks::kBlock / width;
  const int lane = threadIdx.x % width, slot = threadIdx.x / width;
  const long long step = static_cast<long long>(gridDim.x) * per_block;
  // Every lane runs every round so the shuffles and barriers see whole groups.
  for (long long first = static_cast<long long>(blockIdx.x) * per_block; first < rows; first += step) {
    const long long r = first + slot;
    const bool live = r < rows;
    const T* x = in + (live ? r : 0) * C;
    Acc m = ks::neg_inf();
    if (live)
      for (long long k = lane; k < C; k += width) m = ks::max_(m, ks::to_acc(x[k]));
    m = ks::group_reduce<true>(m, width);
    Acc s = 0;
    if (live)
      for (long long k = lane; k < C; k += width) s += ks::exp_(ks::to_acc(x[k]) - m);
    s = ks::group_reduce<false>(s, width);
    if (!live) continue;
    T* y = out + r * C;
    if (log_mode) {
      const Acc log_s = ks::log_(s);  // subtracted after m: m + log_s would round at m's scale
      for (long long k = lane; k < C; k += width) ks::store(y + k, (ks::to_acc(x[k]) - m) - log_s);
    } else {
      const Acc inv = Acc(1) / s;
      for (long long k = lane; k < C; k += width) ks::store(y + k, ks::exp_(ks::to_acc(x[k]) - m) * inv);
    }
  }
}

// loss[i] = -lp[n, label_i, d] for i = n * inner + d over [N, C, inner] log-probabilities;
// valid[i] = 1, or 0 (and loss 0) where label_i == ignore. A label outside [0, C) gives a
// NaN loss: checking it on the host would need a synchronisation.
extern "C" __global__ void kiln_nll_forward(const T* __restrict__ lp, const long long* __restrict__ labels,
                                            T* __restrict__ loss, T* __restrict__ valid, long long M, long long C,
                                            long long inner, long long ignore, int has_ignore) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < M;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long label = labels[i];
    const long long n = i / inner, d = i - n * inner;
    Acc l = 0, w = 1;
    if (has_ignore && label == ignore) w = 0;
    else if (label < 0 || label >= C) l = ks::nan_();
    else l = -ks::to_acc(lp[(n * C + label) * inner + d]);
    ks::store(loss + i, l);
    ks::store(valid + i, w);
  }
}

// grad[n, c, d] = -g[n * inner + d] where c is that element's (non-ignored) label, else 0.
extern "C" __global__ void kiln_nll_backward(const T* __restrict__ g, const long long* __restrict__ labels,
                                             T* __restrict__ grad, long long total, long long C, long long inner,
                                             long long ignore, int has_ignore) {
  for (long long j = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; j < total;
       j += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long d = j % inner, nc = j / inner;
    const long long c = nc % C, n = nc / C;
    const long long i = n * inner + d;
    const long long label = labels[i];
    const bool hit = label == c && !(has_ignore && label == ignore);
    ks::store(grad + j, hit ? -ks::to_acc(g[i]) : Acc(0));
  }
}

// out[r, k] = the product of in[r, j] over j != k: suffix products first (kept in out), then
// each times the prefix, so zeros, infinities and NaN need no division. A thread per row.
extern "C" __global__ void kiln_exclusive_prod(const T* __restrict__ in, T* __restrict__ out, long long rows,
                                               long long C) {
  for (long long r = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<long long>(gridDim.x) * blockDim.x) {
    const T* x = in + r * C;
    T* y = out + r * C;
    Acc suffix = 1;
    for (long long k = C - 1; k >= 0; --k) {
      ks::store(y + k, suffix);
      suffix *= ks::to_acc(x[k]);
    }
    Acc prefix = 1;
    for (long long k = 0; k < C; ++k) {
      ks::store(y + k, prefix * ks::to_acc(y[k]));
      prefix *= ks::to_acc(x[k]);
    }
  }
}
