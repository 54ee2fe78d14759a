// y = value for every element of one dtype. The value arrives as a double plus an exact
// long long (used for integer dtypes). Variant 0: contiguous; 1: strided output view.
// Loops over memory: built at NVRTC's lightest fast-compile level (-Ofc=min), in about half
// the compile time (runtime/compiler.h).
#define KILN_FAST_COMPILE 1
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
#define KILN_VARIANT ${VARIANT}
typedef ${T} T;

struct FillOp {
  T v;
  __device__ __forceinline__ T operator()() const { return v; }
};

#if KILN_VARIANT == 0
extern "C" __global__ void __launch_bounds__(256)
kiln_fill(T* __restrict__ y, long long n, double v, long long vi) {
  kiln::wait_prior_grids();
  kiln::map_contiguous(FillOp{kiln::from_scalar<T>(v, vi)}, y, n);
}
#else
// L: operand 0 = y.
extern "C" __global__ void __launch_bounds__(256)
kiln_fill(T* y, kiln::Layout<1> L, double v, long long vi) {
  kiln::wait_prior_grids();
  kiln::map_strided(FillOp{kiln::from_scalar<T>(v, vi)}, y, L);
}
#endif
