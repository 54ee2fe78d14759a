// The tile engine's staging kernels (gemm_wgmma.cu reads what they write), one a module (KIND)
// and shape-generic, so that a per-shape GEMM module holds only its tile kernel:
//   0 kiln_conv_weights_rsc  convolution mode's A, [m][r][s][c] from weights [m][c][r][s];
//   1 kiln_nchw_to_nhwc      convolution mode's images (and gy), NHWC from NCHW;
//   2 kiln_conv_shift_rows   K-major weight gradients' shifted copies of rows;
//   3 kiln_gemm_sum_splits   the splits' f32 partials added in order.
// SLICES (f32 math only): 2 writes x as paired TF32 slices [hi | lo] and sets *odd where x holds
// inf or NaN; 3 as [hi | lo | hf] (images) or [hi | hf | lo] (weights); 1 copies x as it is.
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
namespace {

using In = ${IN};
${TF32_SPLIT}
#define KILN_SLICES ${SLICES}
#define KILN_KIND ${KIND}

#if KILN_SLICES == 2
// Paired slices of x, `stride` elements apart: [hi | lo]. Inf or NaN sets *odd, which sends the
// tile kernel's k tiles through its finite pass.
__device__ __forceinline__ void write_slices(float* o, long long stride, float x, unsigned* odd) {
  float hi, lo;
  bool nonfinite = false;
  split_f32(x, hi, lo, nonfinite);
  o[0] = hi;
  o[stride] = lo;
  if (nonfinite) *odd = 1u;
}
#elif KILN_SLICES == 3
// Three slices of x, `stride` elements apart: images [hi | lo | hf], weights [hi | hf | lo] (hf:
// hi, or 0 where x is not finite, as it meets the other's lo).
__device__ __forceinline__ void write_slices(float* o, long long stride, float x, bool images) {
  float hi, lo;
  bool odd = false;
  split_f32(x, hi, lo, odd);
  o[0] = hi;
  o[stride] = images ? lo : finite_or_zero(hi);
  o[2 * stride] = images ? finite_or_zero(hi) : lo;
}
#endif

}  // namespace

#if KILN_KIND == 0
// Convolution mode's A, [m][r][s][c], from weights [m][c][r][s]; flipped, from [c][m][r][s] with
// the taps reversed (the input gradient's filter). f32 math: c as its slices. One slice, not
// flipped: `flipped` (unless null) also gets the input gradient's flipped A, [c][r][s][m].
extern "C" __global__ void kiln_conv_weights_rsc(const In* __restrict__ w, In* __restrict__ out,
                                                 In* __restrict__ flipped, int m, int c, int taps, int flip,
                                                 unsigned* odd) {
  kiln::wait_prior_grids();
  // 32-bit index math (the host keeps weights under 2^31 elements): 64-bit division doubled
  // the module's code.
  const int n = m * c * taps, step = gridDim.x * blockDim.x;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
    const int ci = i % c, tap = (i / c) % taps, mi = i / (c * taps);
    const In v = flip ? w[(ci * m + mi) * taps + (taps - 1 - tap)] : w[(mi * c + ci) * taps + tap];
#if KILN_SLICES == 3
    (void)flipped;
    write_slices(out + static_cast<long long>(mi * taps + tap) * 3 * c + ci, c, v, false);
#elif KILN_SLICES == 2
    (void)flipped;
    write_slices(out + static_cast<long long>(mi * taps + tap) * 2 * c + ci, c, v, odd);
#else
    (void)odd;
    out[i] = v;
    if (flipped) flipped[(ci * taps + (taps - 1 - tap)) * m + mi] = v;
#endif
  }
}

#elif KILN_KIND == 1
// Images [z][c][p] (p = h * w pixels) staged as [z][p][c], through 64 x 64 tiles in shared
// memory so that both the reads and the writes are coalesced; each thread has its 16 reads in
// flight at once (a block of 256 threads). f32 math: c as its slices.
extern "C" __global__ void kiln_nchw_to_nhwc(const In* __restrict__ x, In* __restrict__ out, int c, int p, unsigned* odd) {
  kiln::wait_prior_grids();
  constexpr int kT = 64;
  __shared__ In tile[kT][kT + 1];
  const long long image = static_cast<long long>(blockIdx.z) * c * p;
  const int p0 = blockIdx.x * kT, c0 = blockIdx.y * kT, tx = threadIdx.x, ty = threadIdx.y;
  In v[kT / 8][2];
#pragma unroll
  for (int i = 0; i < kT / 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int ch = c0 + ty + 8 * i, px = p0 + tx + 32 * h;
      v[i][h] = ch < c && px < p ? x[image + static_cast<long long>(ch) * p + px] : kiln::cvt<In>(0.f);
    }
#pragma unroll
  for (int i = 0; i < kT / 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) tile[ty + 8 * i][tx + 32 * h] = v[i][h];
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kT / 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int px = p0 + ty + 8 * i, ch = c0 + tx + 32 * h;
      if (px >= p || ch >= c) continue;
      In* o = out + KILN_SLICES * (image + static_cast<long long>(px) * c) + ch;
#if KILN_SLICES == 3
      write_slices(o, c, tile[tx + 32 * h][ty + 8 * i], true);
#elif KILN_SLICES == 2
      write_slices(o, c, tile[tx + 32 * h][ty + 8 * i], odd);
#else
      (void)odd;
      *o = tile[tx + 32 * h][ty + 8 * i];
#endif
    }
}

#elif KILN_KIND == 2
// Weight-gradient mode's K-major copies: plane i (h x w) of x becomes `copies` planes of `rows`
// x `row`, copy s holding x[i][y - ph][q + s - pw] at (y, q), zeros where that is outside x
// or q >= w + 2 * pw - copies + 1 (the output's width); copy s lies s * planes planes on. A
// thread writes 16 bytes of every copy (row is a multiple) from one read of the source row; a
// block covers `per_block` whole planes, so only 32-bit division places an element. SLICES 2:
// the copies hold hi, and `copies` more past them lo (inf or NaN setting *odd).
extern "C" __global__ void kiln_conv_shift_rows(const In* __restrict__ x, In* __restrict__ out, long long planes, int h,
                                                int w, int rows, int row, int copies, int ph, int pw, int per_block,
                                                unsigned* odd) {
  kiln::wait_prior_grids();
  constexpr int kVec = 16 / sizeof(In);
  const int ow = w + 2 * pw - copies + 1, plane = rows * row, chunks = plane / kVec;
  const long long copy_stride = planes * plane, blocks = (planes + per_block - 1) / per_block;
  for (long long b = blockIdx.x; b < blocks; b += gridDim.x) {
    const long long first = b * per_block;
    const int n = static_cast<int>(min(static_cast<long long>(per_block), planes - first)) * chunks;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const int p = i / chunks, e = (i - p * chunks) * kVec, y = e / row - ph, q0 = e % row;
      const bool inside = y >= 0 && y < h;
      const In* src = x + (first + p) * h * w + (inside ? y * w : 0);
      In* dst = out + (first + p) * plane + e;
      for (int s = 0; s < copies; ++s) {
        kiln::Vec<In, kVec> v;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const int q = q0 + j, xq = q + s - pw;
          v.v[j] = inside && q < ow && xq >= 0 && xq < w ? src[xq] : kiln::cvt<In>(0.f);
        }
#if KILN_SLICES == 2
        kiln::Vec<In, kVec> lo;
        bool nonfinite = false;
#pragma unroll
        for (int j = 0; j < kVec; ++j) split_f32(v.v[j], v.v[j], lo.v[j], nonfinite);
        *reinterpret_cast<kiln::Vec<In, kVec>*>(dst + (copies + s) * copy_stride) = lo;
        if (nonfinite) *odd = 1u;
#else
        (void)odd;
#endif
        *reinterpret_cast<kiln::Vec<In, kVec>*>(dst + s * copy_stride) = v;
      }
    }
  }
}

#else
// Weight-gradient mode's result (and split-K's: one tap of c = cp columns): dw[o][c][tap]
// (`taps` taps of `c` channels) is the sum, in order, of the `splits` partials [z][o][tap][cp].
// Threads run along the partials' channels, so the many reads are coalesced and the one write
// is not; eight reads are in flight before they are added.
extern "C" __global__ void kiln_gemm_sum_splits(const float* __restrict__ parts, In* __restrict__ dw, int splits, int m,
                                                int c, int cp, int taps) {
  kiln::wait_prior_grids();
  const int n = m * c * taps, step = gridDim.x * blockDim.x;  // under 2^31 (the plans): 32-bit division
  const long long split = static_cast<long long>(m) * taps * cp;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
    const int ci = i % c, tap = (i / c) % taps, o = i / (c * taps);
    const float* p = parts + static_cast<long long>(o * taps + tap) * cp + ci;
    float sum = 0.f;
    int z = 0;
    for (; z + 8 <= splits; z += 8) {
      float v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = p[(z + j) * split];
#pragma unroll
      for (int j = 0; j < 8; ++j) sum += v[j];
    }
    for (; z < splits; ++z) sum += p[z * split];
    dw[(o * c + ci) * taps + tap] = kiln::cvt<In>(sum);
  }
}
#endif
