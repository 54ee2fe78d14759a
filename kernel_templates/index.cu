// Index kernels: gather (also index_select, through a broadcast index), scatter_add and
// one_hot. Indices are long long (the engine casts i32 to i64). Checking them would need a
// host sync, so an out-of-range device index is not an error: gather reads 0, scatter_add
// drops the element and one_hot leaves the row zero (PyTorch asserts on the device instead).
// KIND: 0 gather, 1 scatter_add, 2 one_hot. T: value storage; ACC: scatter accumulator
// (float for f16/bf16, which the launcher accumulates in an f32 scratch tensor).
// Loops over memory: built at NVRTC's lightest fast-compile level (-Ofc=min), in about half
// the compile time (runtime/compiler.h).
#define KILN_FAST_COMPILE 1
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
typedef ${T} T;
typedef ${ACC} Acc;
#define KILN_INDEX_KIND ${KIND}

// Mirrors IndexLayout in engine/ops/index.cpp. Iteration runs row-major over `size`
// (the index's shape); `dim` is the indexed dim of the `a` operand, whose stride there is
// a_stride[dim]; the index coordinate replaces the loop coordinate in that dim.
struct IndexLayout {
  long long n;
  int ndim;
  int dim;
  long long dim_size;
  long long size[kiln::kMaxDims];
  long long a_stride[kiln::kMaxDims];
  long long idx_stride[kiln::kMaxDims];
  long long b_stride[kiln::kMaxDims];
};

// Offsets of linear position i: into `a` with the indexed dim left out, into the index, and into `b`.
__device__ __forceinline__ void offsets(const IndexLayout& L, long long i, long long& a, long long& idx,
                                        long long& b) {
  a = idx = b = 0;
#pragma unroll 1
  for (int d = L.ndim - 1; d >= 0; --d) {
    const long long c = i % L.size[d];
    i /= L.size[d];
    if (d != L.dim) a += c * L.a_stride[d];
    idx += c * L.idx_stride[d];
    b += c * L.b_stride[d];
  }
}

__device__ __forceinline__ void atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(int* p, int v) { atomicAdd(p, v); }
// Two's complement: an unsigned add is the signed add modulo 2^64.
__device__ __forceinline__ void atomic_add(long long* p, long long v) {
  atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
}

#if KILN_INDEX_KIND == 0
// out (contiguous, the index's shape)[i] = in[..., index[i], ...]; a = in, b unused.
extern "C" __global__ void __launch_bounds__(256)
kiln_gather(const T* __restrict__ in, const long long* __restrict__ index, T* __restrict__ out, IndexLayout L) {
  kiln::wait_prior_grids();
  for (long long i = kiln::thread_index(); i < L.n; i += kiln::thread_count()) {
    long long a, ix, b;
    offsets(L, i, a, ix, b);
    const long long k = index[ix];
    out[i] = (k >= 0 && k < L.dim_size) ? in[a + k * L.a_stride[L.dim]] : T{};
  }
}
#elif KILN_INDEX_KIND == 1
// acc[..., index[i], ...] += src[i] over the index's shape; a = acc, b = src.
extern "C" __global__ void __launch_bounds__(256)
kiln_scatter_add(const T* __restrict__ src, const long long* __restrict__ index, Acc* acc, IndexLayout L) {
  kiln::wait_prior_grids();
  for (long long i = kiln::thread_index(); i < L.n; i += kiln::thread_count()) {
    long long a, ix, b;
    offsets(L, i, a, ix, b);
    const long long k = index[ix];
    if (k >= 0 && k < L.dim_size) atomic_add(acc + a + k * L.a_stride[L.dim], kiln::cvt<Acc>(src[b]));
  }
}
#else
// out (contiguous, [n / classes, classes])[j, c] = index[j] == c; index contiguous.
extern "C" __global__ void __launch_bounds__(256)
kiln_one_hot(const long long* __restrict__ index, T* __restrict__ out, long long n, long long classes) {
  kiln::wait_prior_grids();
  for (long long i = kiln::thread_index(); i < n; i += kiln::thread_count())
    out[i] = index[i / classes] == i % classes ? T(1) : T{};
}
#endif
