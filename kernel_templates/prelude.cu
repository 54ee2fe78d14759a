// Device code shared by every template: rt::device_prelude binds it to each template's
// PRELUDE placeholder after the half-precision headers the dtypes need, so the f16/bf16
// helpers exist only where their header was included. No placeholders here. NVRTC -std=c++17.

namespace kiln {

template <class A, class B> struct is_same { static constexpr bool value = false; };
template <class A> struct is_same<A, A> { static constexpr bool value = true; };

// f16 and bf16 through f32; Half<T>::value is false for every other type (and when the header is absent).
template <class T> struct Half { static constexpr bool value = false; };
#ifdef __CUDA_FP16_H__
template <> struct Half<__half> {
  static constexpr bool value = true;
  static __device__ __forceinline__ float widen(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half narrow(float v) { return __float2half_rn(v); }
};
#endif
#ifdef __CUDA_BF16_H__
template <> struct Half<__nv_bfloat16> {
  static constexpr bool value = true;
  static __device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 narrow(float v) { return __float2bfloat16_rn(v); }
};
#endif

template <class T> constexpr bool is_half = Half<T>::value;
template <class T> constexpr bool is_float = is_same<T, float>::value || is_same<T, double>::value;
template <class T>
constexpr bool is_int = is_same<T, int>::value || is_same<T, long long>::value ||
                        is_same<T, unsigned int>::value || is_same<T, unsigned char>::value;

// Value conversion between storage and compute types. Conventions (the CPU reference
// follows them): f16/bf16 convert through float (so f64 -> f16 rounds twice, as PyTorch
// does); -> bool is x != 0 (NaN -> true); float -> integer truncates toward zero, and
// float -> u8 goes through i64 and wraps like PyTorch's CPU cast. Float -> integer for
// NaN or out-of-range values is undefined in C; here it saturates (NaN -> 0).
template <class To, class From>
__device__ __forceinline__ To cvt(From v) {
  if constexpr (is_half<From>) {
    return cvt<To>(Half<From>::widen(v));
  } else if constexpr (is_same<To, From>::value) {
    return v;
  } else if constexpr (is_same<To, bool>::value) {
    return v != From(0);
  } else if constexpr (is_half<To>) {
    return Half<To>::narrow(static_cast<float>(v));
  } else if constexpr (is_float<From> && is_int<To>) {
    // cvt saturates, but NaN -> i64 (and f64 -> i32) comes out as INT_MIN on sm_90: make NaN 0.
    if (v != v) return To(0);
    if constexpr (is_same<To, unsigned char>::value) return static_cast<unsigned char>(static_cast<long long>(v));
    else return static_cast<To>(v);
  } else {
    return static_cast<To>(v);
  }
}

// *p = v in p's type; a store through a pointer parameter keeps NVVM's read-only (ld.global.nc)
// loads of the kernel's other __restrict__ inputs, which an inline `p[i] = cvt<T>(v)` loses.
template <class T, class From>
__device__ __forceinline__ void store(T* p, From v) { *p = cvt<T>(v); }

// A host scalar (double, plus an exact long long for integers) in type T.
template <class T>
__device__ __forceinline__ T from_scalar(double v, long long vi) {
  if constexpr (is_int<T>) return static_cast<T>(vi);
  else return cvt<T>(v);
}

// NVRTC has no <limits>: the identities of max, min and their arg forms.
template <class T> struct Lim;
template <> struct Lim<float> {
  static __device__ float lowest() { return __int_as_float(0xff800000); }  // -inf
  static __device__ float highest() { return __int_as_float(0x7f800000); }
  static __device__ float nan() { return __int_as_float(0x7fffffff); }
};
template <> struct Lim<double> {
  static __device__ double lowest() { return __longlong_as_double(0xfff0000000000000ULL); }
  static __device__ double highest() { return __longlong_as_double(0x7ff0000000000000ULL); }
  static __device__ double nan() { return __longlong_as_double(0x7fffffffffffffffULL); }
};
template <> struct Lim<long long> {
  static __device__ long long lowest() { return -9223372036854775807LL - 1; }
  static __device__ long long highest() { return 9223372036854775807LL; }
};

// Math over the compute types (float, double, int, long long, unsigned int), so an
// op's expression is written once for every dtype.
namespace math {
#define KILN_MATH1(name)                                                           \
  __device__ __forceinline__ float name(float x) { return ::name##f(x); }        \
  __device__ __forceinline__ double name(double x) { return ::name(x); }
KILN_MATH1(exp) KILN_MATH1(log) KILN_MATH1(log1p) KILN_MATH1(expm1) KILN_MATH1(sqrt)
KILN_MATH1(rsqrt) KILN_MATH1(sin) KILN_MATH1(cos) KILN_MATH1(tanh) KILN_MATH1(erf)
KILN_MATH1(floor) KILN_MATH1(ceil) KILN_MATH1(rint)
#undef KILN_MATH1
__device__ __forceinline__ float pow(float a, float b) { return ::powf(a, b); }
__device__ __forceinline__ double pow(double a, double b) { return ::pow(a, b); }
__device__ __forceinline__ float abs(float x) { return ::fabsf(x); }
__device__ __forceinline__ double abs(double x) { return ::fabs(x); }
__device__ __forceinline__ int abs(int x) { return x < 0 ? -x : x; }
__device__ __forceinline__ long long abs(long long x) { return x < 0 ? -x : x; }
__device__ __forceinline__ unsigned int abs(unsigned int x) { return x; }

// sign(NaN) = 0 and sign(-0.0) = 0, as PyTorch (pytorch/pytorch#41245), not NumPy.
template <class C> __device__ __forceinline__ C sign(C x) {
  return static_cast<C>(static_cast<int>(C(0) < x) - static_cast<int>(x < C(0)));
}
// NaN propagates through relu, clamp, maximum and minimum, as in PyTorch.
template <class C> __device__ __forceinline__ C relu(C x) { return (x != x || x > C(0)) ? x : C(0); }
// Bounds arrive as double; integers compare in double so an infinite bound means "none".
// lo > hi gives hi, as torch.clamp does.
template <class C> __device__ __forceinline__ C clamp(C x, double lo, double hi) {
  if (x != x) return x;
  const double xd = static_cast<double>(x);
  if (xd > hi || lo > hi) return static_cast<C>(hi);
  if (xd < lo) return static_cast<C>(lo);
  return x;
}
// A NaN b falls through to b: comparisons with NaN are false.
template <class C> __device__ __forceinline__ C maximum(C a, C b) { return (a != a || a > b) ? a : b; }
template <class C> __device__ __forceinline__ C minimum(C a, C b) { return (a != a || a < b) ? a : b; }
template <class C> __device__ __forceinline__ C sigmoid(C x) { return C(1) / (C(1) + exp(-x)); }
template <class C> __device__ __forceinline__ C silu(C x) { return x / (C(1) + exp(-x)); }
// Exact gelu: x * Phi(x).
template <class C> __device__ __forceinline__ C gelu(C x) {
  return C(0.5) * x * (C(1) + erf(x * C(0.70710678118654752440)));
}
// beta = 1, threshold = 20, as torch.nn.functional.softplus.
template <class C> __device__ __forceinline__ C softplus(C x) { return x > C(20) ? x : log1p(exp(x)); }
}  // namespace math

// ---- Programmatic dependent launch (sm_90). The runtime may launch a kernel before the one
// ahead of it on the stream has finished; it waits here, before touching global memory, until
// that one has finished and its writes are visible. A template states with
// KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS, after its prelude, that every kernel in it calls this
// first: the runtime launches only such modules' kernels early. No kernel triggers its
// dependents at its start (griddepcontrol.launch_dependents): on the H200 that made the bf16
// cnn step 11% slower (probably its next kernels' blocks placed while this one still held SMs)
// while saving 3% on the mlp; split reductions trigger as their blocks' work ends. ----
__device__ __forceinline__ void wait_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Lets the next kernel launch once every block of this one has called it or exited; it still
// waits for this one's end in wait_prior_grids. Split reductions call it as a block's own work
// ends (last_to_finish), so the next kernel's launch overlaps the last block's merge.
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
#define KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS extern "C" __device__ const int kiln_kernels_wait_for_prior_grids = 1;

// ---- Launch shapes. Operand 0 is the output; inputs follow in parameter order. ----

constexpr int kMaxDims = 8;

__device__ __forceinline__ long long thread_index() {
  return static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ long long thread_count() {
  return static_cast<long long>(gridDim.x) * blockDim.x;
}
// Grid-stride loop over [0, total), for templates that index by hand.
#define KILN_GRID_LOOP(i, total) \
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (total); i += (long long)gridDim.x * blockDim.x)


// Mirrors kiln::kernels::Layout on the host (same field order and sizes). Dims are
// innermost first; strides are in elements (0 = broadcast); ndim == 0 means every
// operand is contiguous over n elements.
template <int NOP> struct Layout {
  long long n;
  int ndim;
  long long size[kMaxDims];
  unsigned magic[kMaxDims], shift[kMaxDims];  // r / size[d] == (umulhi(r, magic) + r) >> shift, r < 2^31
  long long stride[NOP][kMaxDims];
};

template <class T, int N> struct alignas(sizeof(T) * N) Vec { T v[N]; };

template <class... Ts> constexpr int max_size() {
  int m = 1;
  ((m = static_cast<int>(sizeof(Ts)) > m ? static_cast<int>(sizeof(Ts)) : m), ...);
  return m;
}

template <int N, class T> __device__ __forceinline__ bool aligned(const T* p) {
  return reinterpret_cast<unsigned long long>(p) % (sizeof(T) * N) == 0;
}

// Inputs by value: copying each Vec out of global memory is what makes one vector load.
template <int N, class Op, class Tout, class... Vs>
__device__ __forceinline__ void apply_lanes(const Op& op, Vec<Tout, N>& out, const Vs... in) {
#pragma unroll
  for (int j = 0; j < N; ++j) out.v[j] = op(in.v[j]...);
}

// Vectors each thread of a contiguous map handles per pass; the launcher sizes the grid to
// cover every vector in one pass (kContiguousVectorsPerThread in launch_elementwise.cpp).
constexpr int kVectorsPerThread = 2;

template <class T, int N, int U> struct Lanes { Vec<T, N> v[U]; };

// The U vectors at base, base + stride, ... below nv.
template <int U, int N, class T>
__device__ __forceinline__ Lanes<T, N, U> load_lanes(const T* __restrict__ x, long long base, long long nv,
                                                    long long stride) {
  Lanes<T, N, U> r;
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (base + u * stride < nv) r.v[u] = reinterpret_cast<const Vec<T, N>*>(x)[base + u * stride];
  return r;
}

// y[i] = op(x[i]...) for i < n. 16-byte vectors (sized by the widest operand) when every
// pointer is aligned for them, then a scalar tail. Every load of a thread is issued before
// any compute (load_lanes are arguments, evaluated first): with one grid-wide pass this reaches
// copy bandwidth, where a grid-stride loop of one vector per step stayed 3-7% below it on the
// H100. Any grid size is correct.
template <class Op, class Tout, class... Tin>
__device__ __forceinline__ void map_contiguous(const Op& op, Tout* __restrict__ y, long long n,
                                               const Tin* __restrict__... x) {
  constexpr int N = 16 / max_size<Tout, Tin...>();
  constexpr int U = kVectorsPerThread;
  long long done = 0;
  if (N > 1 && aligned<N>(y) && (aligned<N>(x) && ...)) {
    const long long nv = n / N, stride = blockDim.x, span = stride * U;
    for (long long base = blockIdx.x * span + threadIdx.x; base < nv; base += gridDim.x * span) {
      [&](const Lanes<Tin, N, U>&... in) {
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (base + u * stride < nv) {
            Vec<Tout, N> out;
            apply_lanes<N>(op, out, in.v[u]...);
            reinterpret_cast<Vec<Tout, N>*>(y)[base + u * stride] = out;
          }
      }(load_lanes<U, N>(x, base, nv, stride)...);
    }
    done = nv * N;
  }
  for (long long i = done + thread_index(); i < n; i += thread_count()) y[i] = op(x[i]...);
}

// Element offsets of linear output index i for every operand. Below 2^31 elements the
// divisions are multiplications by host-computed magic numbers (a hardware divide costs
// about twenty instructions per dim); 64-bit division otherwise. The dim loops stay
// rolled: indexing the by-value layout reads the parameter space directly (no local
// copy), and unrolling 8 dims doubled the compile time of every strided kernel.
template <int NOP>
__device__ __forceinline__ void offsets(const Layout<NOP>& L, long long i, long long (&off)[NOP]) {
#pragma unroll
  for (int k = 0; k < NOP; ++k) off[k] = 0;
  if (L.n < 0x80000000LL) {
    unsigned r = static_cast<unsigned>(i);
#pragma unroll 1
    for (int d = 0; d < L.ndim; ++d) {
      const unsigned q = (__umulhi(r, L.magic[d]) + r) >> L.shift[d];
      const unsigned c = r - q * static_cast<unsigned>(L.size[d]);
      r = q;
#pragma unroll
      for (int k = 0; k < NOP; ++k) off[k] += static_cast<long long>(c) * L.stride[k][d];
    }
  } else {
    long long r = i;
#pragma unroll 1
    for (int d = 0; d < L.ndim; ++d) {
      const long long q = r / L.size[d], c = r - q * L.size[d];
      r = q;
#pragma unroll
      for (int k = 0; k < NOP; ++k) off[k] += c * L.stride[k][d];
    }
  }
}

template <int... I> struct Seq {};
template <int N, int... I> struct MakeSeq { using type = typename MakeSeq<N - 1, N - 1, I...>::type; };
template <int... I> struct MakeSeq<0, I...> { using type = Seq<I...>; };

template <class Op, class Tout, int NOP, class... Tin, int... I>
__device__ __forceinline__ void map_strided_impl(Seq<I...>, const Op& op, Tout* y, const Layout<NOP>& L,
                                                 const Tin*... x) {
  const long long step = thread_count();
  for (long long i = thread_index(); i < L.n; i += step) {
    long long off[NOP];
    offsets(L, i, off);
    y[off[0]] = op(x[off[I + 1]]...);
  }
}

// y[off0(i)] = op(x[offk(i)]...) over the layout's n elements, grid-stride.
template <class Op, class Tout, int NOP, class... Tin>
__device__ __forceinline__ void map_strided(const Op& op, Tout* y, const Layout<NOP>& L, const Tin*... x) {
  static_assert(NOP == 1 + sizeof...(Tin), "the layout needs one stride row per operand");
  map_strided_impl(typename MakeSeq<static_cast<int>(sizeof...(Tin))>::type{}, op, y, L, x...);
}

// ---- Lanes working together. Every reduction combines in a fixed order, so runs and graph
// replays are bit-identical. kBlock is the launch's block size (a multiple of 32).

struct Sum {
  template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct Max {  // NaN wins, as math::maximum
  template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return math::maximum(a, b); }
};

namespace warp {
// Combines v over the 32 lanes of a warp in a butterfly, op(own, other); every lane receives
// the result.
template <class T, class Op>
__device__ __forceinline__ T reduce(T v, Op op) {
  for (int d = 16; d > 0; d /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, d));
  return v;
}
template <class T> __device__ __forceinline__ T sum(T v) { return reduce(v, Sum()); }
}  // namespace warp

namespace block {
// Combines the warps' results v (each warp's lanes agree) in warp order; every thread receives
// the result. One shared array per (kBlock, T, Op), reused by every call.
template <int kBlock, class T, class Op>
__device__ T combine_warps(T v, Op op) {
  __shared__ T part[kBlock / 32];
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  v = part[0];
  for (int w = 1; w < kBlock / 32; ++w) v = op(v, part[w]);
  __syncthreads();  // part is reused by the next call
  return v;
}

// v combined over the whole block; every thread receives the result.
template <int kBlock, class T> __device__ T sum(T v) { return combine_warps<kBlock>(warp::reduce(v, Sum()), Sum()); }

// True in the one block of the `n` counting on `done` that gets there last; every such block's
// writes before the call are then visible to it. `done` is reset, so the next launch (or graph
// replay) starts from 0.
__device__ bool last_of(unsigned int* done, unsigned int n) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(done, 1u) == n - 1;
  __syncthreads();
  if (last && threadIdx.x == 0) *done = 0;  // no block of this launch touches it again
  return last;
}
// last_of over the whole grid; the next kernel may launch meanwhile.
__device__ bool last_to_finish(unsigned int* done) {
  launch_dependents();
  return last_of(done, gridDim.x);
}

// Column sums in f64 of `rows` x `cols` values (row stride ld) that other blocks parked, into
// dst: threads t < T (whole warps, `sync` their barrier), T / cols of them to a column, each
// adding every (T / cols)-th row in order, 32 loads in flight (the merge ends a kernel: its
// latency is the kernel's), then their sums in thread
// order: the same order whichever block runs it. Reads are coalesced along the rows; `scratch`
// holds T doubles of shared memory.
template <class S, class Sync>
__device__ void sum_columns(const S* src, long long rows, long long cols, long long ld, double* dst, double* scratch,
                            int t, int T, Sync sync) {
  constexpr int kBatch = 32;
  for (long long c0 = 0; c0 < cols; c0 += T) {
    const long long width = cols - c0 < T ? cols - c0 : T;
    const long long per = T / width, part = t / width, col = c0 + t % width;
    double s = 0;
    if (part < per)
      for (long long r0 = part; r0 < rows; r0 += per * kBatch) {
        S v[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) v[j] = r0 + j * per < rows ? __ldcg(src + (r0 + j * per) * ld + col) : S(0);
#pragma unroll
        for (int j = 0; j < kBatch; ++j)
          if (r0 + j * per < rows) s += static_cast<double>(v[j]);
      }
    scratch[t] = s;
    sync();
    if (t < width) {
      double total = 0;
      for (long long p = 0; p < per; ++p) total += scratch[p * width + t];
      dst[c0 + t] = total;
    }
    sync();
  }
}

// The sum, in order, of p[i * stride] for i < n: values other blocks parked before
// last_to_finish, read from L2 (not this SM's L1) eight at a time, so their latencies overlap
// instead of adding up (a merge over 26 splits spent 9 us on them one by one).
template <class A>
__device__ A sum_parked(const A* p, long long stride, int n) {
  constexpr int kBatch = 8;
  A s = 0;
  for (int i0 = 0; i0 < n; i0 += kBatch) {
    A v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) v[j] = i0 + j < n ? __ldcg(p + (i0 + j) * stride) : A(0);
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (i0 + j < n) s += v[j];
  }
  return s;
}
}  // namespace block

// Row kernels give each row a group of `width` lanes: 32 (a warp, kBlock / 32 rows per block) or
// kBlock (the block).
namespace rows {
// Calls f(r, live, lane) for the row of each round that this thread's group owns, rounds
// grid-stride. Every lane runs every round (live false past the last row) so shuffles and
// barriers see whole groups.
template <int kBlock, class F>
__device__ void for_each(long long rows, int width, F f) {
  const int per_block = kBlock / width;
  const int lane = threadIdx.x % width, slot = threadIdx.x / width;
  const long long step = static_cast<long long>(gridDim.x) * per_block;
  for (long long first = static_cast<long long>(blockIdx.x) * per_block; first < rows; first += step)
    f(first + slot, first + slot < rows, lane);
}

// Combines v over the lanes of the row's group; every lane of the group receives the result.
template <int kBlock, class T, class Op>
__device__ T reduce(T v, int width, Op op) {
  v = warp::reduce(v, op);
  if (width == 32) return v;
  return block::combine_warps<kBlock>(v, op);
}
template <int kBlock, class T> __device__ T sum(T v, int width) { return reduce<kBlock>(v, width, Sum()); }
template <int kBlock, class T> __device__ T max(T v, int width) { return reduce<kBlock>(v, width, Max()); }
}  // namespace rows

}  // namespace kiln
