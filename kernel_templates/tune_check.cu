// The tuner's acceptance check on the GPU (kernels::run_tuned): the reference output's largest
// finite magnitude, then how many of a candidate's elements disagree with the reference as
// kernels::outputs_agree says (within `limit`; NaN exactly where the reference has NaN; the
// same infinities). An output is `lines` runs of `length` elements, `stride` apart. Only one
// word comes back to the host, not the outputs: reading back and converting a 51M-element
// output took about 0.7 s per candidate.
// Loops over memory: built at NVRTC's lightest fast-compile level (-Ofc=min), in about half
// the compile time (runtime/compiler.h).
#define KILN_FAST_COMPILE 1
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
typedef ${T} T;
constexpr int kBlock = 256;  // the launch's block

namespace {

__device__ __forceinline__ double value(const T* p, long long i, long long length, long long stride) {
  return static_cast<double>(kiln::cvt<${ACC}>(p[(i / length) * stride + i % length]));
}

struct MaxOp {
  __device__ double operator()(double a, double b) const { return fmax(a, b); }
};

}  // namespace

// *scale = max(*scale, the largest finite |want|), as the bits of a non-negative double (which
// order as the values do).
extern "C" __global__ void __launch_bounds__(kBlock)
kiln_tune_scale(const T* __restrict__ want, long long lines, long long length, long long stride,
                unsigned long long* __restrict__ scale) {
  kiln::wait_prior_grids();
  double m = 0;
  const long long n = lines * length, step = static_cast<long long>(gridDim.x) * kBlock;
  for (long long i = static_cast<long long>(blockIdx.x) * kBlock + threadIdx.x; i < n; i += step) {
    const double w = value(want, i, length, stride);
    if (isfinite(w)) m = fmax(m, fabs(w));
  }
  m = kiln::block::combine_warps<kBlock>(kiln::warp::reduce(m, MaxOp()), MaxOp());
  if (threadIdx.x == 0) atomicMax(scale, static_cast<unsigned long long>(__double_as_longlong(m)));
}

// *bad += the elements of `got` that disagree with `want`.
extern "C" __global__ void __launch_bounds__(kBlock)
kiln_tune_compare(const T* __restrict__ want, const T* __restrict__ got, long long lines, long long length,
                  long long stride, double limit, unsigned long long* __restrict__ bad) {
  kiln::wait_prior_grids();
  unsigned long long count = 0;
  const long long n = lines * length, step = static_cast<long long>(gridDim.x) * kBlock;
  for (long long i = static_cast<long long>(blockIdx.x) * kBlock + threadIdx.x; i < n; i += step) {
    const double w = value(want, i, length, stride), g = value(got, i, length, stride);
    bool ok;
    if (isnan(w) || isnan(g))
      ok = isnan(w) && isnan(g);
    else if (isinf(w) || isinf(g))
      ok = w == g;
    else
      ok = fabs(w - g) <= limit;
    count += ok ? 0 : 1;
  }
  count = kiln::block::sum<kBlock>(count);
  if (threadIdx.x == 0 && count > 0) atomicAdd(bad, count);
}
