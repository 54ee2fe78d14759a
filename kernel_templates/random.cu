// Philox 4x32-10 random numbers with the scheme of engine/include/kiln/random.h. The
// arithmetic repeats engine/ops/random.cpp operation for operation; doubles go through
// explicitly rounded intrinsics so no FMA contraction can make the two devices differ.
// DIST: 0 uniform, 1 normal, 2 randint, 3 bernoulli (scalar p), 4 bernoulli (tensor p).
// Loops over memory: built at NVRTC's lightest fast-compile level (-Ofc=min), in about half
// the compile time (runtime/compiler.h).
#define KILN_FAST_COMPILE 1
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
typedef ${T} T;
#define KILN_DIST ${DIST}

namespace rng {

struct U4 {
  unsigned x[4];
};

__device__ __forceinline__ U4 philox(unsigned long long ctr, unsigned long long seed) {
  unsigned c0 = (unsigned)ctr, c1 = (unsigned)(ctr >> 32), c2 = 0u, c3 = 0u;
  unsigned k0 = (unsigned)seed, k1 = (unsigned)(seed >> 32);
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    if (round) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const unsigned hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const unsigned hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    const unsigned n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  U4 r;
  r.x[0] = c0;
  r.x[1] = c1;
  r.x[2] = c2;
  r.x[3] = c3;
  return r;
}

__device__ __forceinline__ unsigned long long wide(unsigned hi, unsigned lo) {
  return ((unsigned long long)hi << 32) | lo;
}
__device__ __forceinline__ double u24(unsigned x) { return __dmul_rn((double)(x >> 8), 5.9604644775390625e-08); }
__device__ __forceinline__ double u53(unsigned long long w) {
  return __dmul_rn((double)(w >> 11), 1.1102230246251565e-16);
}

// log(x) for x in (0, 1]; see log01 in engine/ops/random.cpp.
__device__ double log01(double x) {
  const unsigned long long bits = (unsigned long long)__double_as_longlong(x);
  long long e = (long long)((bits >> 52) & 0x7ff) - 1023;
  double m = __longlong_as_double((long long)((bits & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL));
  if (m > 1.4142135623730951) {
    m = __dmul_rn(m, 0.5);
    e = e + 1;
  }
  const double s = __ddiv_rn(__dsub_rn(m, 1.0), __dadd_rn(m, 1.0));
  const double s2 = __dmul_rn(s, s);
  double p = 0.047619047619047616;
  p = __fma_rn(p, s2, 0.052631578947368418);
  p = __fma_rn(p, s2, 0.058823529411764705);
  p = __fma_rn(p, s2, 0.066666666666666666);
  p = __fma_rn(p, s2, 0.076923076923076927);
  p = __fma_rn(p, s2, 0.090909090909090912);
  p = __fma_rn(p, s2, 0.1111111111111111);
  p = __fma_rn(p, s2, 0.14285714285714285);
  p = __fma_rn(p, s2, 0.20000000000000001);
  p = __fma_rn(p, s2, 0.33333333333333331);
  const double two_s = __dmul_rn(s, 2.0);
  const double lm = __fma_rn(two_s, __dmul_rn(s2, p), two_s);
  return __fma_rn((double)e, 0.69314718055994529, lm);
}

// sin and cos of 2 pi u for u in [0, 1); see sincos2pi in engine/ops/random.cpp.
__device__ void sincos2pi(double u, double* s_out, double* c_out) {
  const double t = __dmul_rn(u, 4.0);
  int q = (int)t;
  double f = __dsub_rn(t, (double)q);
  if (f > 0.5) {
    f = __dsub_rn(f, 1.0);
    q = q + 1;
  }
  const double x = __dmul_rn(f, 1.5707963267948966);
  const double x2 = __dmul_rn(x, x);
  double ps = 2.8114572543455206e-15;
  ps = __fma_rn(ps, x2, -7.6471637318198164e-13);
  ps = __fma_rn(ps, x2, 1.6059043836821613e-10);
  ps = __fma_rn(ps, x2, -2.505210838544172e-08);
  ps = __fma_rn(ps, x2, 2.7557319223985893e-06);
  ps = __fma_rn(ps, x2, -0.00019841269841269841);
  ps = __fma_rn(ps, x2, 0.0083333333333333332);
  ps = __fma_rn(ps, x2, -0.16666666666666666);
  const double sn = __fma_rn(__dmul_rn(x, x2), ps, x);
  double pc = -1.5619206968586225e-16;
  pc = __fma_rn(pc, x2, 4.7794773323873853e-14);
  pc = __fma_rn(pc, x2, -1.1470745597729725e-11);
  pc = __fma_rn(pc, x2, 2.08767569878681e-09);
  pc = __fma_rn(pc, x2, -2.7557319223985888e-07);
  pc = __fma_rn(pc, x2, 2.4801587301587302e-05);
  pc = __fma_rn(pc, x2, -0.0013888888888888889);
  pc = __fma_rn(pc, x2, 0.041666666666666664);
  pc = __fma_rn(pc, x2, -0.5);
  const double cs = __fma_rn(x2, pc, 1.0);
  switch (q & 3) {
    case 0: *s_out = sn; *c_out = cs; break;
    case 1: *s_out = cs; *c_out = -sn; break;
    case 2: *s_out = -sn; *c_out = -cs; break;
    default: *s_out = -cs; *c_out = sn; break;
  }
}

__device__ __forceinline__ void box_muller(double u1, double u2, double* z0, double* z1) {
  const double r = __dsqrt_rn(__dmul_rn(-2.0, log01(u1)));
  double s, c;
  sincos2pi(u2, &s, &c);
  *z0 = __dmul_rn(r, c);
  *z1 = __dmul_rn(r, s);
}

// The uniform of one word, exact in T: 24 bits (f32), 11 (f16), 8 (bf16).
template <class U>
__device__ __forceinline__ double uniform_word(unsigned x) {
#ifdef __CUDA_FP16_H__
  if constexpr (kiln::is_same<U, __half>::value) return __dmul_rn((double)(x >> 21), 4.8828125e-04);
  else
#endif
#ifdef __CUDA_BF16_H__
  if constexpr (kiln::is_same<U, __nv_bfloat16>::value) return __dmul_rn((double)(x >> 24), 3.90625e-03);
  else
#endif
  return u24(x);
}

}  // namespace rng

// y: n contiguous elements. Thread work item b is Philox block offset + b.
extern "C" __global__ void __launch_bounds__(256)
kiln_random(T* y, long long n, unsigned long long seed, unsigned long long offset, long long low,
            unsigned long long range, double p, const T* probs, const unsigned long long* state) {
  kiln::wait_prior_grids();
  // A captured step's draw: (seed, offset) of this replay are on the device; offset is relative.
  if (state) {
    seed = state[0];
    offset += state[1];
  }
#if KILN_DIST == 0 || KILN_DIST == 1
  const long long per = kiln::is_same<T, double>::value ? 2 : 4;
#elif KILN_DIST == 2
  const long long per = range <= (1ULL << 32) ? 4 : 2;
#else
  const long long per = 4;
#endif
  const long long blocks = (n + per - 1) / per;
  for (long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x; b < blocks;
       b += (long long)gridDim.x * blockDim.x) {
    const rng::U4 x = rng::philox(offset + (unsigned long long)b, seed);
    const long long base = b * per;
#if KILN_DIST == 0
    double v[4];
    if (per == 2) {
      v[0] = rng::u53(rng::wide(x.x[0], x.x[1]));
      v[1] = rng::u53(rng::wide(x.x[2], x.x[3]));
    } else {
      for (int j = 0; j < 4; ++j) v[j] = rng::uniform_word<T>(x.x[j]);
    }
    for (int j = 0; j < per && base + j < n; ++j) y[base + j] = kiln::cvt<T>(v[j]);
#elif KILN_DIST == 1
    double v[4];
    if (per == 2) {
      rng::box_muller(__dadd_rn(rng::u53(rng::wide(x.x[0], x.x[1])), 1.1102230246251565e-16),
                  rng::u53(rng::wide(x.x[2], x.x[3])), &v[0], &v[1]);
    } else {
      rng::box_muller(__dadd_rn(rng::u24(x.x[0]), 5.9604644775390625e-08), rng::u24(x.x[1]), &v[0], &v[1]);
      rng::box_muller(__dadd_rn(rng::u24(x.x[2]), 5.9604644775390625e-08), rng::u24(x.x[3]), &v[2], &v[3]);
    }
    for (int j = 0; j < per && base + j < n; ++j) y[base + j] = kiln::cvt<T>(v[j]);
#elif KILN_DIST == 2
    for (int j = 0; j < per && base + j < n; ++j) {
      const unsigned long long w = per == 2 ? rng::wide(x.x[2 * j], x.x[2 * j + 1]) : (unsigned long long)x.x[j];
      y[base + j] = kiln::cvt<T>(low + (long long)(w % range));
    }
#else
    for (int j = 0; j < 4 && base + j < n; ++j) {
#if KILN_DIST == 3
      const double pj = p;
#else
      const double pj = kiln::cvt<double>(probs[base + j]);
#endif
      y[base + j] = kiln::cvt<T>(rng::u24(x.x[j]) < pj ? 1.0 : 0.0);
    }
#endif
  }
}
