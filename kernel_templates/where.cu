// y = cond ? a : b for one value dtype; cond is bool. Variant 0: contiguous;
// 1: strided/broadcast (up to 8 dims).
// Loops over memory: built at NVRTC's lightest fast-compile level (-Ofc=min), in about half
// the compile time (runtime/compiler.h).
#define KILN_FAST_COMPILE 1
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
#define KILN_VARIANT ${VARIANT}
typedef ${T} T;

struct WhereOp {
  __device__ __forceinline__ T operator()(bool c, T a, T b) const { return c ? a : b; }
};

#if KILN_VARIANT == 0
// cond, a, b, y: n contiguous elements.
extern "C" __global__ void __launch_bounds__(256)
kiln_where(const bool* __restrict__ cond, const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y,
           long long n) {
  kiln::wait_prior_grids();
  kiln::map_contiguous(WhereOp{}, y, n, cond, a, b);
}
#else
// L: operand 0 = y, 1 = cond, 2 = a, 3 = b.
extern "C" __global__ void __launch_bounds__(256)
kiln_where(const bool* cond, const T* a, const T* b, T* y, kiln::Layout<4> L) {
  kiln::wait_prior_grids();
  kiln::map_strided(WhereOp{}, y, L, cond, a, b);
}
#endif
