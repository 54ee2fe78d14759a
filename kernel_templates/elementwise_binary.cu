// y = OP(a, b) for one (input, output) dtype pair; a and b are both inputs in their
// compute type and p0, p1 carry op parameters (user pointwise ops). Variant 0: contiguous; 1: strided/broadcast (up to
// 8 dims); 2: one operand is a host scalar (s as double, si exact for integers), first when scalar_first != 0, and the
// tensor operand is contiguous (L.ndim == 0) or strided. Loops over memory: built at NVRTC's lightest fast-compile
// level (-Ofc=min), in about half the compile time (runtime/compiler.h).
#define KILN_FAST_COMPILE 1
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
#define KILN_VARIANT ${VARIANT}
typedef ${TIN} Tin;
typedef ${TOUT} Tout;
typedef ${COMPUTE} C;

#if KILN_VARIANT == 2
struct ScalarOp {
  C s;
  bool scalar_first;
  double p0, p1;
  __device__ __forceinline__ Tout operator()(Tin in) const {
    const C t = kiln::cvt<C>(in);
    const C a = scalar_first ? s : t;
    const C b = scalar_first ? t : s;
    return kiln::cvt<Tout>(${OP});
  }
};

// L: operand 0 = y, 1 = the tensor operand.
extern "C" __global__ void __launch_bounds__(256)
kiln_binary(const Tin* t, Tout* y, kiln::Layout<2> L, double s, long long si, int scalar_first, double p0,
            double p1) {
  kiln::wait_prior_grids();
  const ScalarOp op{kiln::from_scalar<C>(s, si), scalar_first != 0, p0, p1};
  if (L.ndim == 0) kiln::map_contiguous(op, y, L.n, t);
  else kiln::map_strided(op, y, L, t);
}
#else
struct BinaryOp {
  double p0, p1;
  __device__ __forceinline__ Tout operator()(Tin ain, Tin bin) const {
    const C a = kiln::cvt<C>(ain);
    const C b = kiln::cvt<C>(bin);
    return kiln::cvt<Tout>(${OP});
  }
};

#if KILN_VARIANT == 0
// a, b, y: n contiguous elements.
extern "C" __global__ void __launch_bounds__(256)
kiln_binary(const Tin* __restrict__ a, const Tin* __restrict__ b, Tout* __restrict__ y, long long n, double p0,
            double p1) {
  kiln::wait_prior_grids();
  kiln::map_contiguous(BinaryOp{p0, p1}, y, n, a, b);
}
#else
// L: operand 0 = y, 1 = a, 2 = b.
extern "C" __global__ void __launch_bounds__(256)
kiln_binary(const Tin* a, const Tin* b, Tout* y, kiln::Layout<3> L, double p0, double p1) {
  kiln::wait_prior_grids();
  kiln::map_strided(BinaryOp{p0, p1}, y, L, a, b);
}
#endif
#endif
