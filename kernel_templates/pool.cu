// max_pool2d / avg_pool2d on NCHW contiguous tensors, forward and backward, one module
// per (kind, dtype). Planes are (n*c); max indices are flat h*w offsets within a plane.
// Backward kernels run one thread per input element and gather (no atomics).
${PRELUDE}
typedef ${T} T;
typedef ${ACC} Acc;

struct PoolParams {
  long long planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, include_pad;
};

// The divisor of window (oy, ox): the whole window, or only its elements inside the input.
__device__ __forceinline__ Acc avg_divisor(const PoolParams& p, long long oy, long long ox) {
  if (p.include_pad) return Acc(p.kh * p.kw);
  const long long y0 = oy * p.sh - p.ph, x0 = ox * p.sw - p.pw;
  const long long y1 = min(y0 + p.kh, p.h), x1 = min(x0 + p.kw, p.w);
  const long long cy = y1 - max(y0, 0LL), cx = x1 - max(x0, 0LL);
  return Acc(cy * cx);
}

#if ${KIND} == 0
// y, idx (planes, oh, ow); NaN wins, as in PyTorch.
extern "C" __global__ void __launch_bounds__(256)
kiln_max_pool2d(const T* __restrict__ x, T* __restrict__ y, long long* __restrict__ idx, PoolParams p) {
  KILN_GRID_LOOP(i, p.planes * p.oh * p.ow) {
    const long long ox = i % p.ow, oy = (i / p.ow) % p.oh, plane = i / (p.ow * p.oh);
    const T* xp = x + plane * p.h * p.w;
    Acc best = Acc(0);
    long long best_i = -1;
    bool nan_seen = false;
    for (long long ki = 0; ki < p.kh && !nan_seen; ++ki) {
      const long long iy = oy * p.sh - p.ph + ki * p.dh;
      if (iy < 0 || iy >= p.h) continue;
      for (long long kj = 0; kj < p.kw && !nan_seen; ++kj) {
        const long long ix = ox * p.sw - p.pw + kj * p.dw;
        if (ix < 0 || ix >= p.w) continue;
        const Acc v = kiln::cvt<Acc>(xp[iy * p.w + ix]);
        if (best_i < 0 || v > best || v != v) {
          best = v;
          best_i = iy * p.w + ix;
          nan_seen = v != v;
        }
      }
    }
    y[i] = kiln::cvt<T>(best);
    idx[i] = best_i;
  }
}
#elif ${KIND} == 1
extern "C" __global__ void __launch_bounds__(256) kiln_avg_pool2d(const T* __restrict__ x, T* __restrict__ y, PoolParams p) {
  KILN_GRID_LOOP(i, p.planes * p.oh * p.ow) {
    const long long ox = i % p.ow, oy = (i / p.ow) % p.oh, plane = i / (p.ow * p.oh);
    const T* xp = x + plane * p.h * p.w;
    Acc s = Acc(0);
    for (long long ki = 0; ki < p.kh; ++ki) {
      const long long iy = oy * p.sh - p.ph + ki;
      if (iy < 0 || iy >= p.h) continue;
      for (long long kj = 0; kj < p.kw; ++kj) {
        const long long ix = ox * p.sw - p.pw + kj;
        if (ix >= 0 && ix < p.w) s += kiln::cvt<Acc>(xp[iy * p.w + ix]);
      }
    }
    y[i] = kiln::cvt<T>(s / avg_divisor(p, oy, ox));
  }
}
#elif ${KIND} == 2
// dx (planes, h, w) from g and idx (planes, oh, ow).
extern "C" __global__ void __launch_bounds__(256)
kiln_max_pool2d_backward(const T* __restrict__ g, const long long* __restrict__ idx, T* __restrict__ dx, PoolParams p) {
  KILN_GRID_LOOP(i, p.planes * p.h * p.w) {
    const long long ix = i % p.w, iy = (i / p.w) % p.h, plane = i / (p.w * p.h);
    const long long me = iy * p.w + ix, base = plane * p.oh * p.ow;
    Acc s = Acc(0);
    for (long long ki = 0; ki < p.kh; ++ki) {
      const long long yy = iy + p.ph - ki * p.dh;
      if (yy < 0 || yy % p.sh != 0 || yy / p.sh >= p.oh) continue;
      for (long long kj = 0; kj < p.kw; ++kj) {
        const long long xx = ix + p.pw - kj * p.dw;
        if (xx < 0 || xx % p.sw != 0 || xx / p.sw >= p.ow) continue;
        const long long o = base + (yy / p.sh) * p.ow + xx / p.sw;
        if (idx[o] == me) s += kiln::cvt<Acc>(g[o]);
      }
    }
    dx[i] = kiln::cvt<T>(s);
  }
}
#else
extern "C" __global__ void __launch_bounds__(256) kiln_avg_pool2d_backward(const T* __restrict__ g, T* __restrict__ dx, PoolParams p) {
  KILN_GRID_LOOP(i, p.planes * p.h * p.w) {
    const long long ix = i % p.w, iy = (i / p.w) % p.h, plane = i / (p.w * p.h);
    const long long base = plane * p.oh * p.ow;
    Acc s = Acc(0);
    for (long long ki = 0; ki < p.kh; ++ki) {
      const long long yy = iy + p.ph - ki;
      if (yy < 0 || yy % p.sh != 0 || yy / p.sh >= p.oh) continue;
      for (long long kj = 0; kj < p.kw; ++kj) {
        const long long xx = ix + p.pw - kj;
        if (xx < 0 || xx % p.sw != 0 || xx / p.sw >= p.ow) continue;
        const long long oy = yy / p.sh, ox = xx / p.sw;
        s += kiln::cvt<Acc>(g[base + oy * p.ow + ox]) / avg_divisor(p, oy, ox);
      }
    }
    dx[i] = kiln::cvt<T>(s);
  }
}
#endif
