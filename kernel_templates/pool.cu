// max_pool2d / avg_pool2d on NCHW contiguous tensors, forward and backward, one module
// per (kind, dtype). Planes are (n*c); max indices are flat h*w offsets within a plane.
// Backward kernels run one thread per input element and gather (no atomics). Index math is in
// 32 bits when every index fits (64-bit divisions cost several times more).
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
typedef ${T} T;
typedef ${ACC} Acc;

struct PoolParams {
  long long planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, include_pad;
};

// PoolParams in the index type I.
template <class I>
struct Geom {
  I planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, include_pad;
  __device__ explicit Geom(const PoolParams& p)
      : planes(I(p.planes)), h(I(p.h)), w(I(p.w)), oh(I(p.oh)), ow(I(p.ow)), kh(I(p.kh)), kw(I(p.kw)), sh(I(p.sh)),
        sw(I(p.sw)), ph(I(p.ph)), pw(I(p.pw)), dh(I(p.dh)), dw(I(p.dw)), include_pad(I(p.include_pad)) {}
};

// Up to 2^30 elements on either side, i + stride stays below 2^31 in the grid loops.
__device__ __forceinline__ bool fits_32(const PoolParams& p) {
  return p.planes * p.h * p.w <= (1LL << 30) && p.planes * p.oh * p.ow <= (1LL << 30);
}

#define POOL_GRID_LOOP(I, i, total) \
  for (I i = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); i < (total); i += I(gridDim.x) * I(blockDim.x))

// The divisor of window (oy, ox): the whole window, or only its elements inside the input.
template <class I>
__device__ __forceinline__ Acc avg_divisor(const Geom<I>& p, I oy, I ox) {
  if (p.include_pad) return Acc(p.kh * p.kw);
  const I y0 = oy * p.sh - p.ph, x0 = ox * p.sw - p.pw;
  const I y1 = min(y0 + p.kh, p.h), x1 = min(x0 + p.kw, p.w);
  const I cy = y1 - max(y0, I(0)), cx = x1 - max(x0, I(0));
  return Acc(cy * cx);
}

#if ${KIND} == 0
// y, idx (planes, oh, ow); NaN wins, as in PyTorch.
template <class I>
__device__ __forceinline__ void max_pool(const T* __restrict__ x, T* __restrict__ y, long long* __restrict__ idx,
                                         const Geom<I> p) {
  POOL_GRID_LOOP(I, i, p.planes * p.oh * p.ow) {
    const I ox = i % p.ow, oy = (i / p.ow) % p.oh, plane = i / (p.ow * p.oh);
    const T* xp = x + (long long)plane * p.h * p.w;
    Acc best = Acc(0);
    I best_i = -1;
    bool nan_seen = false;
    for (I ki = 0; ki < p.kh && !nan_seen; ++ki) {
      const I iy = oy * p.sh - p.ph + ki * p.dh;
      if (iy < 0 || iy >= p.h) continue;
      for (I kj = 0; kj < p.kw && !nan_seen; ++kj) {
        const I ix = ox * p.sw - p.pw + kj * p.dw;
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

extern "C" __global__ void __launch_bounds__(256)
kiln_max_pool2d(const T* __restrict__ x, T* __restrict__ y, long long* __restrict__ idx, PoolParams p) {
  kiln::wait_prior_grids();
  if (fits_32(p)) max_pool(x, y, idx, Geom<int>(p));
  else max_pool(x, y, idx, Geom<long long>(p));
}
#elif ${KIND} == 1
template <class I>
__device__ __forceinline__ void avg_pool(const T* __restrict__ x, T* __restrict__ y, const Geom<I> p) {
  POOL_GRID_LOOP(I, i, p.planes * p.oh * p.ow) {
    const I ox = i % p.ow, oy = (i / p.ow) % p.oh, plane = i / (p.ow * p.oh);
    const T* xp = x + (long long)plane * p.h * p.w;
    Acc s = Acc(0);
    for (I ki = 0; ki < p.kh; ++ki) {
      const I iy = oy * p.sh - p.ph + ki;
      if (iy < 0 || iy >= p.h) continue;
      for (I kj = 0; kj < p.kw; ++kj) {
        const I ix = ox * p.sw - p.pw + kj;
        if (ix >= 0 && ix < p.w) s += kiln::cvt<Acc>(xp[iy * p.w + ix]);
      }
    }
    y[i] = kiln::cvt<T>(s / avg_divisor(p, oy, ox));
  }
}

extern "C" __global__ void __launch_bounds__(256) kiln_avg_pool2d(const T* __restrict__ x, T* __restrict__ y, PoolParams p) {
  kiln::wait_prior_grids();
  if (fits_32(p)) avg_pool(x, y, Geom<int>(p));
  else avg_pool(x, y, Geom<long long>(p));
}
#elif ${KIND} == 2
template <class I>
__device__ __forceinline__ void max_pool_backward(const T* __restrict__ g, const long long* __restrict__ idx,
                                                  T* __restrict__ dx, const Geom<I> p) {
  if (p.kh == p.sh && p.kw == p.sw && p.ph == 0 && p.pw == 0 && p.dh == 1 && p.dw == 1) {
    // Windows that tile the input: a thread per window (those past oh, ow included, whose
    // elements get zeros) writes each of its elements once, the window found once.
    const I wy = (p.h + p.sh - 1) / p.sh, wx = (p.w + p.sw - 1) / p.sw;
    POOL_GRID_LOOP(I, j, p.planes * wy * wx) {
      const I row = j / wx, ox = j - row * wx, plane = row / wy, oy = row - plane * wy;
      const bool pooled = oy < p.oh && ox < p.ow;
      const I o = (plane * p.oh + oy) * p.ow + ox;
      const long long at = pooled ? idx[o] : -1;
      const Acc gv = pooled ? kiln::cvt<Acc>(g[o]) : Acc(0);
      T* dp = dx + (long long)plane * p.h * p.w;
      for (I ky = 0, iy = oy * p.sh; ky < p.sh && iy < p.h; ++ky, ++iy)
        for (I kx = 0, ix = ox * p.sw; kx < p.sw && ix < p.w; ++kx, ++ix) {
          const I me = iy * p.w + ix;
          dp[me] = kiln::cvt<T>(at == me ? gv : Acc(0));
        }
    }
    return;
  }
  POOL_GRID_LOOP(I, i, p.planes * p.h * p.w) {
    const I ix = i % p.w, iy = (i / p.w) % p.h, plane = i / (p.w * p.h);
    const I me = iy * p.w + ix, base = plane * p.oh * p.ow;
    Acc s = Acc(0);
    for (I ki = 0; ki < p.kh; ++ki) {
      const I yy = iy + p.ph - ki * p.dh;
      if (yy < 0 || yy % p.sh != 0 || yy / p.sh >= p.oh) continue;
      for (I kj = 0; kj < p.kw; ++kj) {
        const I xx = ix + p.pw - kj * p.dw;
        if (xx < 0 || xx % p.sw != 0 || xx / p.sw >= p.ow) continue;
        const I o = base + (yy / p.sh) * p.ow + xx / p.sw;
        if (idx[o] == me) s += kiln::cvt<Acc>(g[o]);
      }
    }
    dx[i] = kiln::cvt<T>(s);
  }
}

// dx (planes, h, w) from g and idx (planes, oh, ow).
extern "C" __global__ void __launch_bounds__(256)
kiln_max_pool2d_backward(const T* __restrict__ g, const long long* __restrict__ idx, T* __restrict__ dx, PoolParams p) {
  kiln::wait_prior_grids();
  if (fits_32(p)) max_pool_backward(g, idx, dx, Geom<int>(p));
  else max_pool_backward(g, idx, dx, Geom<long long>(p));
}
#else
template <class I>
__device__ __forceinline__ void avg_pool_backward(const T* __restrict__ g, T* __restrict__ dx, const Geom<I> p) {
  POOL_GRID_LOOP(I, i, p.planes * p.h * p.w) {
    const I ix = i % p.w, iy = (i / p.w) % p.h, plane = i / (p.w * p.h);
    const I base = plane * p.oh * p.ow;
    Acc s = Acc(0);
    for (I ki = 0; ki < p.kh; ++ki) {
      const I yy = iy + p.ph - ki;
      if (yy < 0 || yy % p.sh != 0 || yy / p.sh >= p.oh) continue;
      for (I kj = 0; kj < p.kw; ++kj) {
        const I xx = ix + p.pw - kj;
        if (xx < 0 || xx % p.sw != 0 || xx / p.sw >= p.ow) continue;
        const I oy = yy / p.sh, ox = xx / p.sw;
        s += kiln::cvt<Acc>(g[base + oy * p.ow + ox]) / avg_divisor(p, oy, ox);
      }
    }
    dx[i] = kiln::cvt<T>(s);
  }
}

extern "C" __global__ void __launch_bounds__(256) kiln_avg_pool2d_backward(const T* __restrict__ g, T* __restrict__ dx, PoolParams p) {
  kiln::wait_prior_grids();
  if (fits_32(p)) avg_pool_backward(g, dx, Geom<int>(p));
  else avg_pool_backward(g, dx, Geom<long long>(p));
}
#endif
