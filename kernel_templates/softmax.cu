// softmax / log_softmax over contiguous rows [rows, C], the gather/scatter kernels of
// nll_loss and the fused softmax cross-entropy. An op's module holds only its own entry
// (#ifdef KILN_ENTRY_<name>, defined by the runtime). T is the storage type, Acc the compute
// type (float for f16/bf16/f32, double for f64), Loss the fused cross-entropy's loss type (T, or
// float for 16-bit logits whose loss is f32; T in the other entries). NVRTC -std=c++17, no C++
// library.
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
typedef ${T} T;
typedef ${ACC} Acc;
typedef ${LOSS} Loss;

constexpr int kBlock = 256;  // the launcher always launches 256 threads

// A row's max m (NaN wins) and s = sum exp(x - m), reduced over the `width` lanes that share
// it. Every lane calls it, dead rows too, so the shuffles and barriers see whole groups.
__device__ void row_stats(const T* x, long long C, int lane, int width, bool live, Acc& m, Acc& s) {
  m = kiln::Lim<Acc>::lowest();
  if (live)
    for (long long k = lane; k < C; k += width) m = kiln::math::maximum(m, kiln::cvt<Acc>(x[k]));
  m = kiln::rows::max<kBlock>(m, width);
  s = 0;
  if (live)
    for (long long k = lane; k < C; k += width) s += kiln::math::exp(kiln::cvt<Acc>(x[k]) - m);
  s = kiln::rows::sum<kBlock>(s, width);
}

#ifdef KILN_ENTRY_kiln_softmax
// out[r, :] = softmax(in[r, :]) (log_mode: log_softmax). width 32: a warp per row, eight
// rows per block; width 256: a block per row (kiln::rows::for_each).
extern "C" __global__ void kiln_softmax(const T* __restrict__ in, T* __restrict__ out, long long rows, long long C,
                                        int width, int log_mode) {
  kiln::wait_prior_grids();
  kiln::rows::for_each<kBlock>(rows, width, [&](long long r, bool live, int lane) {
    const T* x = in + (live ? r : 0) * C;
    Acc m, s;
    row_stats(x, C, lane, width, live, m, s);
    if (!live) return;
    T* y = out + r * C;
    if (log_mode) {
      const Acc log_s = kiln::math::log(s);  // subtracted after m: m + log_s would round at m's scale
      for (long long k = lane; k < C; k += width) kiln::store(y + k, (kiln::cvt<Acc>(x[k]) - m) - log_s);
    } else {
      const Acc inv = Acc(1) / s;
      for (long long k = lane; k < C; k += width)
        kiln::store(y + k, kiln::math::exp(kiln::cvt<Acc>(x[k]) - m) * inv);
    }
  });
}
#endif

#ifdef KILN_ENTRY_kiln_nll_forward
// loss[i] = -lp[n, label_i, d] for i = n * inner + d over [N, C, inner] log-probabilities;
// valid[i] = 1, or 0 (and loss 0) where label_i == ignore. A label outside [0, C) gives a
// NaN loss: checking it on the host would need a synchronisation.
extern "C" __global__ void kiln_nll_forward(const T* __restrict__ lp, const long long* __restrict__ labels,
                                            T* __restrict__ loss, T* __restrict__ valid, long long M, long long C,
                                            long long inner, long long ignore, int has_ignore) {
  kiln::wait_prior_grids();
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < M;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long label = labels[i];
    const long long n = i / inner, d = i - n * inner;
    Acc l = 0, w = 1;
    if (has_ignore && label == ignore) w = 0;
    else if (label < 0 || label >= C) l = kiln::Lim<Acc>::nan();
    else l = -kiln::cvt<Acc>(lp[(n * C + label) * inner + d]);
    kiln::store(loss + i, l);
    kiln::store(valid + i, w);
  }
}
#endif

#ifdef KILN_ENTRY_kiln_nll_backward
// grad[n, c, d] = -g[n * inner + d] where c is that element's (non-ignored) label, else 0.
extern "C" __global__ void kiln_nll_backward(const T* __restrict__ g, const long long* __restrict__ labels,
                                             T* __restrict__ grad, long long total, long long C, long long inner,
                                             long long ignore, int has_ignore) {
  kiln::wait_prior_grids();
  for (long long j = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; j < total;
       j += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long d = j % inner, nc = j / inner;
    const long long c = nc % C, n = nc / C;
    const long long i = n * inner + d;
    const long long label = labels[i];
    const bool hit = label == c && !(has_ignore && label == ignore);
    kiln::store(grad + j, hit ? -kiln::cvt<Acc>(g[i]) : Acc(0));
  }
}
#endif

// Blocks of one softmax_cross_entropy launch that have finished; the last one resets it to 0,
// so the next launch (or graph replay) starts from 0. Per module, and kiln launches one
// device's kernels on one stream, so launches never overlap.
__device__ unsigned int kiln_ce_blocks_done;

#if defined(KILN_ENTRY_kiln_softmax_cross_entropy) || defined(KILN_CROSS_ENTROPY_ROWS)
// Fused softmax cross-entropy over contiguous logits x (N, C) and labels (N). Per row r:
// stats[r] = lse = m + log s (m the max, s = sum exp(x - m)) and, for label y,
// loss = (1 - eps) * ((m - x[y]) + log s) + eps * ((m - mean x) + log s): 0 where y is
// ignored, NaN where y is outside [0, C). reduction 0 (none) writes each row's loss to
// out[r]; 1 (sum) and 2 (mean) park them in `rows` and the last block to finish sums them
// in a fixed order (bit-identical runs, no float atomics) into out[0]. stats[N] = the count
// of rows not ignored. Rows as kiln_softmax (width 32: a warp per row, 256: a block per row).
// unit_dx, when given (reduction sum, or mean with no label ignored), gets the gradient for a
// loss gradient of 1, as kiln_softmax_cross_entropy_backward writes it (the same bits).
// Every lane of a row's group calls before_row(r, live, lane) first: a kernel that computes
// the logits itself writes row r there (gemm_rowdot.cu), so x is not __restrict__; and every
// lane of a live row calls after_row(r, lane) once its unit_dx is stored (gemm_rowdot.cu reads
// it back for the layer's input gradient), so neither is unit_dx.
template <class BeforeRow, class AfterRow>
__device__ void cross_entropy_rows(const T* x, const long long* __restrict__ labels, Loss* __restrict__ out, Acc* rows,
                                   Acc* __restrict__ stats, T* unit_dx, long long N, long long C, int width,
                                   int reduction, double smoothing, long long ignore, int has_ignore,
                                   BeforeRow before_row, AfterRow after_row) {
  const Acc eps = static_cast<Acc>(smoothing);
  kiln::rows::for_each<kBlock>(N, width, [&](long long r, bool live, int lane) {
    before_row(r, live, lane);
    const T* xr = x + (live ? r : 0) * C;
    Acc m, s, sx = 0;
    row_stats(xr, C, lane, width, live, m, s);
    if (eps != Acc(0)) {  // the smoothing term's mean of x: a third pass over the cached row
      if (live)
        for (long long k = lane; k < C; k += width) sx += kiln::cvt<Acc>(xr[k]);
      sx = kiln::rows::sum<kBlock>(sx, width);
    }
    if (!live) return;
    const Acc log_s = kiln::math::log(s), lse = m + log_s;
    const long long y = labels[r];
    if (unit_dx) {  // the backward's arithmetic, with g = 1 (sum) or 1 / N (mean)
      const bool dead = (has_ignore && y == ignore) || y < 0 || y >= C;
      const Acc scale = reduction == 2 ? Acc(1) / static_cast<Acc>(N) : Acc(1);
      for (long long k = lane; k < C; k += width) {
        const Acc target = eps / static_cast<Acc>(C) + (k == y ? Acc(1) - eps : Acc(0));
        kiln::store(unit_dx + r * C + k,
                    dead ? Acc(0) : scale * (kiln::math::exp(kiln::cvt<Acc>(xr[k]) - lse) - target));
      }
    }
    after_row(r, lane);
    if (lane != 0) return;
    stats[r] = lse;
    Acc l = 0;
    if (has_ignore && y == ignore)
      l = 0;
    else if (y < 0 || y >= C)
      l = kiln::Lim<Acc>::nan();
    else {
      l = (m - kiln::cvt<Acc>(xr[y])) + log_s;
      if (eps != Acc(0)) l = (Acc(1) - eps) * l + eps * ((m - sx / static_cast<Acc>(C)) + log_s);
    }
    if (reduction == 0)
      kiln::store(out + r, l);
    else
      rows[r] = l;
  });
  if (!kiln::block::last_to_finish(&kiln_ce_blocks_done)) return;
  const volatile Acc* parked = rows;  // written by other blocks: skip this SM's L1
  Acc total = 0, valid = 0;
  for (long long i = threadIdx.x; i < N; i += kBlock) {
    if (reduction != 0) total += parked[i];
    if (!(has_ignore && labels[i] == ignore)) valid += Acc(1);
  }
  total = kiln::block::sum<kBlock>(total);
  valid = kiln::block::sum<kBlock>(valid);
  if (threadIdx.x != 0) return;
  stats[N] = valid;
  if (reduction == 1) kiln::store(out, total);
  if (reduction == 2) kiln::store(out, total / valid);
}
#endif

#ifdef KILN_ENTRY_kiln_softmax_cross_entropy
extern "C" __global__ void kiln_softmax_cross_entropy(const T* __restrict__ x, const long long* __restrict__ labels,
                                                      Loss* __restrict__ out, Acc* rows, Acc* __restrict__ stats,
                                                      T* __restrict__ unit_dx, long long N, long long C, int width,
                                                      int reduction, double smoothing, long long ignore,
                                                      int has_ignore) {
  kiln::wait_prior_grids();
  cross_entropy_rows(
      x, labels, out, rows, stats, unit_dx, N, C, width, reduction, smoothing, ignore, has_ignore,
      [](long long, bool, int) {}, [](long long, int) {});
}
#endif

#ifdef KILN_ENTRY_kiln_softmax_cross_entropy_backward
// dx[r, c] = s_r * (exp(x[r, c] - lse[r]) - (1 - eps) * [c == y_r] - eps / C) over (N, C),
// with lse = stats[0, N) and s_r = g[r] (none), g[0] (sum) or g[0] / stats[N] (mean), read
// on the device; 0 for rows whose label is ignored or outside [0, C).
extern "C" __global__ void kiln_softmax_cross_entropy_backward(const Loss* __restrict__ g, const T* __restrict__ x,
                                                               const long long* __restrict__ labels,
                                                               const Acc* __restrict__ stats, T* __restrict__ dx,
                                                               long long N, long long C, int reduction,
                                                               double smoothing, long long ignore, int has_ignore) {
  kiln::wait_prior_grids();
  const Acc eps = static_cast<Acc>(smoothing);
  const long long total = N * C;
  for (long long j = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; j < total;
       j += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long r = j / C, c = j - r * C;
    const long long y = labels[r];
    if ((has_ignore && y == ignore) || y < 0 || y >= C) {
      kiln::store(dx + j, Acc(0));
      continue;
    }
    const Acc s = reduction == 0 ? kiln::cvt<Acc>(g[r]) : reduction == 1 ? kiln::cvt<Acc>(g[0]) : kiln::cvt<Acc>(g[0]) / stats[N];
    const Acc target = eps / static_cast<Acc>(C) + (c == y ? Acc(1) - eps : Acc(0));
    kiln::store(dx + j, s * (kiln::math::exp(kiln::cvt<Acc>(x[j]) - stats[r]) - target));
  }
}
#endif

#ifdef KILN_ENTRY_kiln_exclusive_prod
// out[r, k] = the product of in[r, j] over j != k: suffix products first (kept in out), then
// each times the prefix, so zeros, infinities and NaN need no division. A thread per row.
extern "C" __global__ void kiln_exclusive_prod(const T* __restrict__ in, T* __restrict__ out, long long rows,
                                               long long C) {
  kiln::wait_prior_grids();
  for (long long r = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<long long>(gridDim.x) * blockDim.x) {
    const T* x = in + r * C;
    T* y = out + r * C;
    Acc suffix = 1;
    for (long long k = C - 1; k >= 0; --k) {
      kiln::store(y + k, suffix);
      suffix *= kiln::cvt<Acc>(x[k]);
    }
    Acc prefix = 1;
    for (long long k = 0; k < C; ++k) {
      kiln::store(y + k, prefix * kiln::cvt<Acc>(y[k]));
      prefix *= kiln::cvt<Acc>(x[k]);
    }
  }
}
#endif
