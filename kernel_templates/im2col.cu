// im2col / col2im for conv2d on NCHW, one module per dtype. cols is (C*kh*kw, n*L) with
// L = oh*ow: row (c, ki, kj), column (b, oy, ox); conv2d's GEMMs read it per group.
// KIND selects the entry (0: im2col, 1: col2im); f16/bf16 accumulate in f32.
// Loops over memory: built at NVRTC's lightest fast-compile level (-Ofc=min), in about half
// the compile time (runtime/compiler.h).
#define KILN_FAST_COMPILE 1
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
typedef ${T} T;
typedef ${ACC} Acc;

struct ConvParams {
  long long n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw;
};

#if ${KIND} == 0
// x (n, c, h, w) contiguous -> cols; padding reads as zero.
extern "C" __global__ void __launch_bounds__(256) kiln_im2col(const T* __restrict__ x, T* __restrict__ cols, ConvParams p) {
  kiln::wait_prior_grids();
  const long long L = p.oh * p.ow, ncols = p.n * L;
  KILN_GRID_LOOP(i, p.c * p.kh * p.kw * ncols) {
    const long long col = i % ncols, row = i / ncols;
    const long long b = col / L, l = col % L, oy = l / p.ow, ox = l % p.ow;
    const long long kj = row % p.kw, ki = (row / p.kw) % p.kh, c = row / (p.kw * p.kh);
    const long long iy = oy * p.sh - p.ph + ki * p.dh, ix = ox * p.sw - p.pw + kj * p.dw;
    T v = kiln::cvt<T>(Acc(0));
    if (iy >= 0 && iy < p.h && ix >= 0 && ix < p.w) v = x[((b * p.c + c) * p.h + iy) * p.w + ix];
    cols[i] = v;
  }
}
#else
// cols -> dx (n, c, h, w): each input element sums the columns that read it (no atomics).
extern "C" __global__ void __launch_bounds__(256) kiln_col2im(const T* __restrict__ cols, T* __restrict__ dx, ConvParams p) {
  kiln::wait_prior_grids();
  const long long L = p.oh * p.ow, ncols = p.n * L;
  KILN_GRID_LOOP(i, p.n * p.c * p.h * p.w) {
    const long long ix = i % p.w, iy = (i / p.w) % p.h, c = (i / (p.w * p.h)) % p.c, b = i / (p.w * p.h * p.c);
    Acc s = Acc(0);
    for (long long ki = 0; ki < p.kh; ++ki) {
      const long long y = iy + p.ph - ki * p.dh;
      if (y < 0 || y % p.sh != 0 || y / p.sh >= p.oh) continue;
      const long long oy = y / p.sh;
      for (long long kj = 0; kj < p.kw; ++kj) {
        const long long xx = ix + p.pw - kj * p.dw;
        if (xx < 0 || xx % p.sw != 0 || xx / p.sw >= p.ow) continue;
        const long long row = (c * p.kh + ki) * p.kw + kj;
        s += kiln::cvt<Acc>(cols[row * ncols + b * L + oy * p.ow + xx / p.sw]);
      }
    }
    dx[i] = kiln::cvt<T>(s);
  }
}
#endif
