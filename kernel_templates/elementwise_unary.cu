// y = OP(x) for one (input, output) dtype pair; x is the input in its compute type and
// p0, p1 carry op parameters (leaky_relu slope, clamp bounds), so every unary op shares
// one signature. Cast is the op "x". Variant 0: contiguous; 1: strided (up to 8 dims).
// Loops over memory: built at NVRTC's lightest fast-compile level (-Ofc=min), in about half
// the compile time (runtime/compiler.h).
#define KILN_FAST_COMPILE 1
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
#define KILN_VARIANT ${VARIANT}
typedef ${TIN} Tin;
typedef ${TOUT} Tout;
typedef ${COMPUTE} C;

struct UnaryOp {
  double p0, p1;
  __device__ __forceinline__ Tout operator()(Tin in) const {
    const C x = kiln::cvt<C>(in);
    return kiln::cvt<Tout>(${OP});
  }
};

#if KILN_VARIANT == 0
// x, y: n contiguous elements.
extern "C" __global__ void __launch_bounds__(256)
kiln_unary(const Tin* __restrict__ x, Tout* __restrict__ y, long long n, double p0, double p1) {
  kiln::wait_prior_grids();
  kiln::map_contiguous(UnaryOp{p0, p1}, y, n, x);
}
#else
// L: operand 0 = y, 1 = x.
extern "C" __global__ void __launch_bounds__(256)
kiln_unary(const Tin* x, Tout* y, kiln::Layout<2> L, double p0, double p1) {
  kiln::wait_prior_grids();
  kiln::map_strided(UnaryOp{p0, p1}, y, L, x);
}
#endif
