// Fused batch norm and layer norm (engine/ops/norm_batch.cpp, norm_layer.cpp). One module per
// (T, P): T the storage type of x, y and the gradients, P that of the parameters (weight, bias,
// running statistics; f32 for f16/bf16 x under mixed precision), Acc the compute type (double
// for f64 x, else float). Statistics are taken over x - shift (shift: the channel's or row's
// first value, so float keeps its precision far from zero): batch norm sums each thread's
// values and makes them moments once, layer norm pushes Welford's per value; moments merge
// with Chan's formula in a fixed order, and cross-block sums are combined by the last block:
// runs and graph replays are bit-identical. An op's module holds only its own entry
// (#ifdef KILN_ENTRY_<name>, defined by the runtime). NVRTC -std=c++17, no C++ library.
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
typedef ${T} T;
typedef ${P} P;
typedef ${ACC} Acc;

constexpr int kBlock = 256;  // the launchers always launch 256 threads

// Welford's statistics: count, mean and sum of squared deviations (M2) of some values.
namespace welford {

struct Moments {
  long long n;
  Acc mean, m2;
};

__device__ __forceinline__ void push(Moments& m, Acc v) {
  m.n += 1;
  const Acc d = v - m.mean;
  m.mean += d / static_cast<Acc>(m.n);
  m.m2 += d * (v - m.mean);
}

// Chan's parallel merge. Not symmetric in rounding: callers always pass the lower part first.
__device__ __forceinline__ Moments merge(const Moments& a, const Moments& b) {
  if (b.n == 0) return a;
  if (a.n == 0) return b;
  const long long n = a.n + b.n;
  const Acc d = b.mean - a.mean, wb = static_cast<Acc>(b.n) / static_cast<Acc>(n);
  return {n, a.mean + d * wb, a.m2 + b.m2 + d * d * static_cast<Acc>(a.n) * wb};
}

// Merges the moments of `width` lanes (32: a warp; kBlock: the block). Every lane ends with the
// same bits: each butterfly step merges the lower lane's part first.
__device__ Moments reduce(Moments m, int width) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int d = 16; d > 0; d /= 2) {
    const Moments o{__shfl_xor_sync(0xffffffffu, m.n, d), __shfl_xor_sync(0xffffffffu, m.mean, d),
                    __shfl_xor_sync(0xffffffffu, m.m2, d)};
    m = (lane & d) ? merge(o, m) : merge(m, o);
  }
  if (width == 32) return m;
  __shared__ long long pn[kBlock / 32];
  __shared__ Acc pmean[kBlock / 32], pm2[kBlock / 32];
  if (lane == 0) {
    pn[warp] = m.n;
    pmean[warp] = m.mean;
    pm2[warp] = m.m2;
  }
  __syncthreads();
  m = Moments{pn[0], pmean[0], pm2[0]};
  for (int w = 1; w < kBlock / 32; ++w) m = merge(m, Moments{pn[w], pmean[w], pm2[w]});
  __syncthreads();  // the arrays are reused by the next call
  return m;
}

}  // namespace welford

// 1/sqrt(var + eps) with a correctly rounded sqrt (rsqrtf is off by up to 2 ulp).
__device__ __forceinline__ Acc inv_std(Acc var, double eps) {
  return Acc(1) / kiln::math::sqrt(var + static_cast<Acc>(eps));
}

// The mean of values whose M2 is NaN (a NaN or an Inf among them) is NaN as well: Welford's
// running mean would otherwise be Inf or NaN depending on the order the values came in.
__device__ __forceinline__ Acc checked_mean(const welford::Moments& m) {
  return m.m2 != m.m2 ? kiln::Lim<Acc>::nan() : m.mean;
}

// The sum in f64 of `rows` f32 partials at p that a conv parked (every thread of the block calls
// it and receives it): each thread adds every kBlock-th in order, then the warps' sums in order.
__device__ double parts_sum(const float* __restrict__ p, long long rows) {
  double s = 0;
#pragma unroll 4
  for (long long r = threadIdx.x; r < rows; r += kBlock) s += static_cast<double>(p[r]);
  return kiln::block::sum<kBlock>(s);
}

// An apply kernel's statistics of channel c: eval, from the running statistics; training, the
// statistics kernel's mean and invstd, or with `totals` ((2, C) f64 sums and squares of x from
// the kernel that wrote it, over M values a channel) mean = sum / M, var = squares / M - mean^2
// in f64 (each divided as a product with 1 / M).
struct StatsSource {
  P* running_mean;
  P* running_var;
  Acc* mean;
  Acc* invstd;
  const double* totals;
  long long C, M;
  int eval;
  double eps;
  // From totals, where each value's channel is worked out (a window's, a row's): two loads that
  // overlap x's, not a block-wide pass before them.
  __device__ __forceinline__ void moments(long long c, double& mu, double& var) const {
    moments_of(totals[c], totals[C + c], mu, var);
  }
  __device__ __forceinline__ void moments_of(double sum, double squares, double& mu, double& var) const {
    const double per = 1.0 / static_cast<double>(M);
    mu = sum * per;
    const double v = squares * per - mu * mu;
    var = v < 0.0 ? 0.0 : v;  // NaN stays NaN
  }
  __device__ __forceinline__ void get(long long c, Acc& mu, Acc& is) const {
    if (eval) {
      mu = kiln::cvt<Acc>(running_mean[c]);
      is = inv_std(kiln::cvt<Acc>(running_var[c]), eps);
    } else if (totals) {
      double m, v;
      moments(c, m, v);
      mu = static_cast<Acc>(m);
      is = inv_std(static_cast<Acc>(v), eps);
    } else {
      mu = mean[c];
      is = invstd[c];
    }
  }
  // Block 0's part: in eval the saved statistics for the backward; in training from totals the
  // saved ones, the running ones (unbiased variance) and the batch counter, as the statistics
  // kernel would have.
  __device__ void publish(long long* tracked, double momentum) const {
    if (blockIdx.x != 0 || (!eval && !totals)) return;
    const Acc mom = static_cast<Acc>(momentum);
    if (!eval && tracked && threadIdx.x == 0) *tracked += 1;
    for (long long c = threadIdx.x; c < C; c += blockDim.x) {
      get(c, mean[c], invstd[c]);
      if (eval) continue;
      double m, v;
      moments(c, m, v);
      update_running(c, m, v, mom);
    }
  }
  __device__ void update_running(long long c, double m, double v, Acc mom) const {
    if (running_mean)
      kiln::store(running_mean + c, (Acc(1) - mom) * kiln::cvt<Acc>(running_mean[c]) + mom * static_cast<Acc>(m));
    if (running_var)
      kiln::store(running_var + c, (Acc(1) - mom) * kiln::cvt<Acc>(running_var[c]) +
                                       mom * static_cast<Acc>(v * static_cast<double>(M) / static_cast<double>(M - 1)));
  }
};

// Calls f(offset) for the values i = first + threadIdx.x, + kBlock, ... < last of channel c
// of x (N, C, S) contiguous, where i = n * S + s; steps (n, s) without a division per value.
// Offsets come eight at a time, so the loads in f are issued together rather than one
// memory latency per value (the speedrun's batch-norm statistics went 4x faster).
template <class F>
__device__ __forceinline__ void for_channel_range(long long c, long long C, long long S, long long first,
                                                  long long last, F f) {
  long long i = first + threadIdx.x;
  if (i >= last) return;
  const long long cs = C * S, qn = kBlock / S, qs = kBlock - qn * S;  // kBlock = qn * S + qs
  const long long n = i / S;
  long long s = i - n * S, base = n * cs + c * S;
  auto advance = [&] {
    s += qs;
    base += qn * cs;
    if (s >= S) {
      s -= S;
      base += cs;
    }
  };
  constexpr int kBatch = 8;
  long long left = (last - i + kBlock - 1) / kBlock;  // this thread's values
  for (; left >= kBatch; left -= kBatch) {
    long long off[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      off[j] = base + s;
      advance();
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) f(off[j]);
  }
  for (; left > 0; --left) {
    f(base + s);
    advance();
  }
}

// Sums of x - shift (sum, squares, count) over values [first, last) of channel c of x (N, C, S)
// contiguous, V values a load: S % V == 0 and x 16-byte aligned (the launcher checks), so a
// V-aligned group never leaves one image's row. The unaligned head and tail, fewer than V values
// each, go a value a thread. Offsets in 32 bits (`narrow`) when x's size allows.
template <int V, bool kNarrow>
__device__ __forceinline__ void sum_channel_vec(const T* __restrict__ x, long long c, long long C, long long S,
                                                long long first, long long last, Acc shift, Acc& sum, Acc& sq,
                                                long long& count) {
  struct alignas(V * sizeof(T)) Group {
    T v[V];
  };
  auto at = [&](long long i) -> long long {
    if (kNarrow) {
      const unsigned n = static_cast<unsigned>(i) / static_cast<unsigned>(S);
      return static_cast<long long>(n * static_cast<unsigned>(C * S) + static_cast<unsigned>(c * S) +
                                    (static_cast<unsigned>(i) - n * static_cast<unsigned>(S)));
    }
    const long long n = i / S;
    return n * C * S + c * S + (i - n * S);
  };
  auto add = [&](Acc v) {
    v -= shift;
    sum += v;
    sq += v * v;
  };
  long long a = (first + V - 1) / V * V, b = last / V * V;
  if (a > last) a = last;
  if (b < a) b = a;
  if (threadIdx.x < a - first) {
    add(kiln::cvt<Acc>(x[at(first + threadIdx.x)]));
    ++count;
  }
  if (threadIdx.x < last - b) {
    add(kiln::cvt<Acc>(x[at(b + threadIdx.x)]));
    ++count;
  }
  const long long groups = (b - a) / V;
  constexpr int kBatch = 4;  // groups a thread loads before adding any
  long long g = threadIdx.x;
  for (; g + (kBatch - 1) * kBlock < groups; g += kBatch * kBlock) {
    Group r[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) r[j] = *reinterpret_cast<const Group*>(x + at(a + (g + j * kBlock) * V));
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
#pragma unroll
      for (int e = 0; e < V; ++e) add(kiln::cvt<Acc>(r[j].v[e]));
    count += kBatch * V;
  }
  for (; g < groups; g += kBlock) {
    const Group r = *reinterpret_cast<const Group*>(x + at(a + g * V));
#pragma unroll
    for (int e = 0; e < V; ++e) add(kiln::cvt<Acc>(r.v[e]));
    count += V;
  }
}

// The channel of element i of x (N, C, S).
__device__ __forceinline__ long long channel_of(long long i, long long C, long long S, long long total) {
  if (total < 0x80000000LL) return (static_cast<unsigned>(i) / static_cast<unsigned>(S)) % static_cast<unsigned>(C);
  return (i / S) % C;
}

// ---- Batch norm over x (N, C, S) contiguous, M = N * S values per channel. ----

// This block's sdy and sdx (sum dy', sum dy' * (x - mean)) summed and parked in parts (2, C * splits).
__device__ void park_backward_sums(Acc sdy, Acc sdx, Acc* parts, long long C, int splits) {
  sdy = kiln::block::sum<kBlock>(sdy);
  sdx = kiln::block::sum<kBlock>(sdx);
  if (threadIdx.x == 0) {
    parts[blockIdx.x] = sdy;
    parts[C * splits + blockIdx.x] = sdx;
  }
}

// The end of a backward reduction over channels split across blocks: the block that finishes
// last adds each channel's parts into sums (2, C), which are also dbias and dweight (written when
// non-null, in P).
__device__ void finish_backward_sums(Acc sdy, Acc sdx, Acc* parts, unsigned int* done, const Acc* __restrict__ invstd,
                                     Acc* __restrict__ sums, P* __restrict__ dweight, P* __restrict__ dbias,
                                     long long C, int splits) {
  park_backward_sums(sdy, sdx, parts, C, splits);
  if (!kiln::block::last_to_finish(done)) return;
  for (long long ch = threadIdx.x; ch < C; ch += kBlock) {
    const Acc a = kiln::block::sum_parked(parts + ch * splits, 1, splits);
    const Acc b = kiln::block::sum_parked(parts + C * splits + ch * splits, 1, splits) * invstd[ch];
    sums[ch] = a;
    sums[C + ch] = b;
    if (dbias) kiln::store(dbias + ch, a);
    if (dweight) kiln::store(dweight + ch, b);
  }
}

__device__ unsigned int kiln_bn_stats_done;
__device__ unsigned int kiln_bn_backward_done;

#ifdef KILN_ENTRY_kiln_batch_norm_stats
// Training statistics in one pass over x. Block b takes channel b / splits and its values
// [chunk * (b % splits), + chunk), parking their mean and M2 in parts (2, C * splits); the last
// block merges each channel's parts in order, writes mean and invstd (C) and, when given,
// updates running_mean/var = (1 - momentum) * running + momentum * batch (unbiased variance)
// and adds one to the batch counter `tracked` (a module's num_batches_tracked: no kernel of its own).
extern "C" __global__ void __launch_bounds__(kBlock, sizeof(T) == 8 ? 3 : 5)
    kiln_batch_norm_stats(const T* __restrict__ x, Acc* parts, Acc* __restrict__ mean, Acc* __restrict__ invstd,
                          P* running_mean, P* running_var, long long* tracked, long long C, long long S, long long M,
                          long long chunk, int splits, double momentum, double eps, int vec) {
  kiln::wait_prior_grids();
  const long long c = blockIdx.x / splits, first = chunk * (blockIdx.x % splits);
  const long long last = first + chunk < M ? first + chunk : M;
  const Acc shift = kiln::cvt<Acc>(x[c * S]);  // every block of the channel uses the same one
  // A thread's values as plain sums of x - shift (no division per value, two independent
  // chains), turned into moments once; the shift keeps sum - sum^2/n far from cancelling.
  Acc sum = 0, sq = 0;
  long long count = 0;
  constexpr int kVec = 16 / sizeof(T), kHalfVec = 8 / sizeof(T);
  const bool narrow = C * M < 0x80000000LL;
  if (vec == kVec && narrow) {
    sum_channel_vec<kVec, true>(x, c, C, S, first, last, shift, sum, sq, count);
  } else if (vec == kVec) {
    sum_channel_vec<kVec, false>(x, c, C, S, first, last, shift, sum, sq, count);
  } else if (kHalfVec > 1 && vec == kHalfVec && narrow) {
    sum_channel_vec<(kHalfVec > 1 ? kHalfVec : 2), true>(x, c, C, S, first, last, shift, sum, sq, count);
  } else {
    for_channel_range(c, C, S, first, last, [&](long long o) {
      const Acc v = kiln::cvt<Acc>(x[o]) - shift;
      sum += v;
      sq += v * v;
      ++count;
    });
  }
  welford::Moments m{0, 0, 0};
  if (count > 0) {
    const Acc mean = sum / static_cast<Acc>(count), m2 = sq - sum * mean;
    m = welford::Moments{count, mean, m2 < Acc(0) ? Acc(0) : m2};  // NaN stays NaN
  }
  m = welford::reduce(m, kBlock);
  const long long slots = C * splits;
  if (threadIdx.x == 0) {
    parts[blockIdx.x] = m.mean;
    parts[slots + blockIdx.x] = m.m2;
  }
  if (!kiln::block::last_to_finish(&kiln_bn_stats_done)) return;
  if (tracked && threadIdx.x == 0) *tracked += 1;
  const Acc mom = static_cast<Acc>(momentum);
  for (long long ch = threadIdx.x; ch < C; ch += kBlock) {
    welford::Moments t{0, 0, 0};
    // The parts from L2, eight splits' loads at a time (see kiln::block::sum_parked).
    constexpr int kBatch = 8;
    for (int b0 = 0; b0 < splits; b0 += kBatch) {
      Acc pm[kBatch], p2[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        pm[j] = b0 + j < splits ? __ldcg(parts + ch * splits + b0 + j) : Acc(0);
        p2[j] = b0 + j < splits ? __ldcg(parts + slots + ch * splits + b0 + j) : Acc(0);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const long long lo = chunk * (b0 + j), hi = lo + chunk < M ? lo + chunk : M;
        if (b0 + j < splits && hi > lo) t = welford::merge(t, welford::Moments{hi - lo, pm[j], p2[j]});
      }
    }
    const Acc mu = kiln::cvt<Acc>(x[ch * S]) + checked_mean(t);
    mean[ch] = mu;
    invstd[ch] = inv_std(t.m2 / static_cast<Acc>(M), eps);
    if (running_mean) kiln::store(running_mean + ch, (Acc(1) - mom) * kiln::cvt<Acc>(running_mean[ch]) + mom * mu);
    if (running_var)
      kiln::store(running_var + ch, (Acc(1) - mom) * kiln::cvt<Acc>(running_var[ch]) +
                                        mom * (t.m2 / static_cast<Acc>(M - 1)));
  }
}
#endif

#ifdef KILN_ENTRY_kiln_batch_norm_apply
// y = (x - mean) * invstd * weight + bias, then ReLU when `relu`; weight and bias may be null.
// Training reads mean/invstd (C); eval computes them from running_mean/var and also writes them
// to mean/invstd for the backward pass.
// With `totals` (training), the statistics come from them (StatsSource), counted in `tracked`.
extern "C" __global__ void kiln_batch_norm_apply(const T* __restrict__ x, const P* __restrict__ weight,
                                                 const P* __restrict__ bias, P* running_mean, P* running_var, Acc* mean,
                                                 Acc* invstd, T* __restrict__ y, long long total, long long C,
                                                 long long S, int eval, int relu, double eps, const double* totals,
                                                 long long* tracked, double momentum) {
  kiln::wait_prior_grids();
  const StatsSource src{running_mean, running_var, mean, invstd, totals, C, C > 0 ? total / C : 0, eval, eps};
  src.publish(tracked, momentum);
  auto apply = [&](long long i, long long c) {
    Acc mu, is;
    src.get(c, mu, is);
    Acc v = (kiln::cvt<Acc>(x[i]) - mu) * is;
    if (weight) v *= kiln::cvt<Acc>(weight[c]);
    if (bias) v += kiln::cvt<Acc>(bias[c]);
    if (relu) v = kiln::math::relu(v);
    kiln::store(y + i, v);
  };
  if (S < kBlock / 2) {  // short rows (BatchNorm1d): every thread on its own elements
    KILN_GRID_LOOP(i, total) apply(i, channel_of(i, C, S, total));
    return;
  }
  // A block per row of S values of one channel: the channel is found once per row, not
  // with two integer divisions per value.
  const long long rows = total / S;
  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
    const long long c = row % C, base = row * S;
    for (long long s = threadIdx.x; s < S; s += blockDim.x) apply(base + s, c);
  }
}
#endif

#ifdef KILN_ENTRY_kiln_batch_norm_merge_parts
// totals (2, C) f64 for the apply kernel: each row of a conv's partials (2 * C, rows) added up
// (parts_sum), a block a row.
extern "C" __global__ void __launch_bounds__(kBlock)
    kiln_batch_norm_merge_parts(const float* __restrict__ parts, long long rows, double* __restrict__ totals) {
  kiln::wait_prior_grids();
  const double s = parts_sum(parts + static_cast<long long>(blockIdx.x) * rows, rows);
  if (threadIdx.x == 0) totals[blockIdx.x] = s;
}
#endif

#ifdef KILN_ENTRY_kiln_batch_norm_backward_reduce
// Per-channel sums of the backward pass, split across blocks as kiln_batch_norm_stats: with dy'
// = g, or g where y > 0 when the ReLU was fused, sums (2, C) = (sum dy', sum dy' * xhat), which
// are also dbias and dweight (written when non-null, in P).
extern "C" __global__ void __launch_bounds__(kBlock, 4)
    kiln_batch_norm_backward_reduce(const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ y,
                                    const Acc* __restrict__ mean, const Acc* __restrict__ invstd, Acc* parts,
                                    Acc* __restrict__ sums, P* __restrict__ dweight, P* __restrict__ dbias, long long C,
                                    long long S, long long M, long long chunk, int splits, int relu) {
  kiln::wait_prior_grids();
  const long long c = blockIdx.x / splits, first = chunk * (blockIdx.x % splits);
  const long long last = first + chunk < M ? first + chunk : M;
  const Acc mu = mean[c];
  Acc sdy = 0, sdx = 0;  // sum dy', sum dy' * (x - mean)
  for_channel_range(c, C, S, first, last, [&](long long o) {
    Acc dy = kiln::cvt<Acc>(g[o]);
    if (relu && !(kiln::cvt<Acc>(y[o]) > Acc(0))) dy = 0;
    sdy += dy;
    sdx += dy * (kiln::cvt<Acc>(x[o]) - mu);
  });
  finish_backward_sums(sdy, sdx, parts, &kiln_bn_backward_done, invstd, sums, dweight, dbias, C, splits);
}
#endif

#ifdef KILN_ENTRY_kiln_batch_norm_backward_dx
// dx = weight * invstd * (dy' - (sum dy' + xhat * sum dy' xhat) / M) in training; in eval the
// statistics are constants and dx = weight * invstd * dy'. weight may be null (1).
extern "C" __global__ void kiln_batch_norm_backward_dx(const T* __restrict__ g, const T* __restrict__ x,
                                                       const T* __restrict__ y, const P* __restrict__ weight,
                                                       const Acc* __restrict__ mean, const Acc* __restrict__ invstd,
                                                       const Acc* __restrict__ sums, T* __restrict__ dx,
                                                       long long total, long long C, long long S, long long M,
                                                       int training, int relu) {
  kiln::wait_prior_grids();
  const Acc inv_m = Acc(1) / static_cast<Acc>(M);
  KILN_GRID_LOOP(i, total) {
    const long long c = channel_of(i, C, S, total);
    Acc dy = kiln::cvt<Acc>(g[i]);
    if (relu && !(kiln::cvt<Acc>(y[i]) > Acc(0))) dy = 0;
    const Acc is = invstd[c];
    const Acc scale = weight ? is * kiln::cvt<Acc>(weight[c]) : is;
    if (training) {
      const Acc xhat = (kiln::cvt<Acc>(x[i]) - mean[c]) * is;
      dy = dy - sums[c] * inv_m - xhat * (sums[C + c] * inv_m);
    }
    kiln::store(dx + i, scale * dy);
  }
}
#endif

// ---- Batch norm, optional ReLU and a max pool whose kh x kw windows tile x (N, C, H, W)
// (stride = kernel, no padding): the normalized values are never stored. The backward finds each
// window's argmax again from x and the statistics in the same arithmetic, so only x is saved.
// Values, maxima and ties are those of batch_norm_apply then max_pool2d, bit for bit. ----

struct PoolTiles {
  long long planes, C, H, W, oh, ow, kh, kw;
};

// PoolTiles in index type I (32 bits when every offset fits: 64-bit divisions cost several times
// more), the window fixed at compile time when KH, KW > 0 (2 x 2: its loads are issued together).
template <class I, int KH, int KW>
struct Tiles {
  I planes, C, H, W, oh, ow, kh, kw;
  __device__ explicit Tiles(const PoolTiles& t)
      : planes(I(t.planes)),
        C(I(t.C)),
        H(I(t.H)),
        W(I(t.W)),
        oh(I(t.oh)),
        ow(I(t.ow)),
        kh(KH > 0 ? I(KH) : I(t.kh)),
        kw(KW > 0 ? I(KW) : I(t.kw)) {}
};

// The one window path a pooled module carries (its spec's variant, chosen by the launcher; the
// other entries' modules: 0), so each compiles a sixth of the code: one window a thread with
// offsets in 32 bits (0, 1) or 64 (2, 3), the window fixed at 2 x 2 (0, 2) or any (1, 3); or
// groups of 4 (4) or 2 (5) windows along a row.
// clang-format off
#define KILN_POOL_PATH ${POOL_PATH}
// clang-format on
#if KILN_POOL_PATH == 2 || KILN_POOL_PATH == 3
#define KILN_POOL_INDEX long long
#else
#define KILN_POOL_INDEX unsigned
#endif
#if KILN_POOL_PATH == 1 || KILN_POOL_PATH == 3
#define KILN_POOL_WINDOW 0
#else
#define KILN_POOL_WINDOW 2
#endif
#define KILN_POOL_GROUP (KILN_POOL_PATH == 4 ? 4 : 2)

// clang-format off
${BN_POOL_WINDOW}
// clang-format on

// The max of window (oy, ox) of the plane at x + plane.
template <class I, int KH, int KW>
__device__ __forceinline__ WindowMax<I> window_max(const T* __restrict__ plane, const Tiles<I, KH, KW>& g, I oy, I ox,
                                                   const Affine& f, int relu) {
  MaxScan<I> scan;
  const I top = oy * g.kh * g.W + ox * g.kw;
  if constexpr (KH > 0) {
    Acc xs[KH * KW];  // loaded together, then compared in order
#pragma unroll
    for (int ky = 0; ky < KH; ++ky)
#pragma unroll
      for (int kx = 0; kx < KW; ++kx) xs[ky * KW + kx] = kiln::cvt<Acc>(plane[top + I(ky) * g.W + I(kx)]);
#pragma unroll
    for (int ky = 0; ky < KH; ++ky)
#pragma unroll
      for (int kx = 0; kx < KW; ++kx) scan.offer(top + I(ky) * g.W + I(kx), xs[ky * KW + kx], f, relu);
  } else {
    for (I ky = 0; ky < g.kh; ++ky)
      for (I kx = 0; kx < g.kw; ++kx)
        scan.offer(top + ky * g.W + kx, kiln::cvt<Acc>(plane[top + ky * g.W + kx]), f, relu);
  }
  return scan.best;
}

// ---- 2 x 2 windows in groups of G along a row (W % 2G == 0, offsets in 32 bits, every pointer
// aligned to a group's loads: the launcher checks). A thread loads a group's two rows of x with
// one vector load each and its G pooled values with one, and stores likewise; each window as
// window_max takes it, with `at` its value's place in row-major order (0-3). ----
struct QuadGroup {
  unsigned c;
  long long x, pooled;  // offsets of the group's first value in x (N, C, H, W) and (N, C, oh, ow)
};
// Groups of a plane of the pooled output.
__device__ __forceinline__ unsigned quad_groups_per_plane(const PoolTiles& t, int G) {
  return unsigned(t.oh) * (unsigned(t.ow) / unsigned(G));
}
__device__ __forceinline__ unsigned quad_groups(const PoolTiles& t, int G) {
  return unsigned(t.planes) * quad_groups_per_plane(t, G);
}
// Group r (row-major) of a plane.
template <int G>
__device__ __forceinline__ QuadGroup quad_group_of(unsigned plane, unsigned r, const PoolTiles& t) {
  const unsigned W = unsigned(t.W), ow = unsigned(t.ow), per_row = ow / G, oy = r / per_row, gx = r - oy * per_row;
  return {plane % unsigned(t.C), static_cast<long long>((plane * unsigned(t.H) + 2 * oy) * W + 2 * G * gx),
          static_cast<long long>((plane * unsigned(t.oh) + oy) * ow + G * gx)};
}
// Group i of all planes.
template <int G>
__device__ __forceinline__ QuadGroup quad_group(unsigned i, const PoolTiles& t) {
  const unsigned per_plane = quad_groups_per_plane(t, G), plane = i / per_plane;
  return quad_group_of<G>(plane, i - plane * per_plane, t);
}
template <int N>
__device__ __forceinline__ void quad_values(const kiln::Vec<T, N>& r0, const kiln::Vec<T, N>& r1, int j, Acc (&xs)[4]) {
  xs[0] = kiln::cvt<Acc>(r0.v[2 * j]);
  xs[1] = kiln::cvt<Acc>(r0.v[2 * j + 1]);
  xs[2] = kiln::cvt<Acc>(r1.v[2 * j]);
  xs[3] = kiln::cvt<Acc>(r1.v[2 * j + 1]);
}
template <class V>
__device__ __forceinline__ V load_vec(const T* p) {
  return *reinterpret_cast<const V*>(p);
}

#ifdef KILN_ENTRY_kiln_batch_norm_max_pool
// Window w of `plane`, pooled into y.
template <class I, int KH, int KW>
__device__ __forceinline__ void pool_window(const T* __restrict__ x, const Affine& f, T* __restrict__ y,
                                            const Tiles<I, KH, KW>& g, I plane, I w, int relu) {
  const I oy = w / g.ow, ox = w - oy * g.ow;
  kiln::store(y + plane * (g.oh * g.ow) + w,
              window_max(x + static_cast<long long>(plane) * g.H * g.W, g, oy, ox, f, relu).value);
}

// A group's G windows from its two rows of x, pooled into y at `pooled`.
template <int G>
__device__ __forceinline__ void pool_quads(const kiln::Vec<T, 2 * G>& r0, const kiln::Vec<T, 2 * G>& r1,
                                           const Affine& f, T* __restrict__ pooled, int relu) {
  kiln::Vec<T, G> out;
#pragma unroll
  for (int j = 0; j < G; ++j) {
    Acc xs[4];
    quad_values(r0, r1, j, xs);
    out.v[j] = kiln::cvt<T>(quad_max(xs, f, relu).value);
  }
  *reinterpret_cast<kiln::Vec<T, G>*>(pooled) = out;
}

template <class I, int KH, int KW>
__device__ __forceinline__ void bn_max_pool(const T* __restrict__ x, const P* __restrict__ weight,
                                            const P* __restrict__ bias, const StatsSource& src, T* __restrict__ y,
                                            const PoolTiles& t, int relu) {
  const Tiles<I, KH, KW> g(t);
  const I per_plane = g.oh * g.ow, windows = g.planes * per_plane;
  for (I i = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); i < windows; i += I(gridDim.x) * I(blockDim.x)) {
    const I plane = i / per_plane;
    Affine f{Acc(0), Acc(0), weight, bias, static_cast<long long>(plane % g.C)};
    src.get(f.c, f.mu, f.is);
    pool_window(x, f, y, g, plane, i - plane * per_plane, relu);
  }
}

template <int G>
__device__ __forceinline__ void bn_max_pool_quads(const T* __restrict__ x, const P* __restrict__ weight,
                                                  const P* __restrict__ bias, const StatsSource& src, T* __restrict__ y,
                                                  const PoolTiles& t, int relu) {
  const unsigned groups = quad_groups(t, G);
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < groups; i += gridDim.x * blockDim.x) {
    const QuadGroup q = quad_group<G>(i, t);
    Affine f{Acc(0), Acc(0), weight, bias, static_cast<long long>(q.c)};
    src.get(f.c, f.mu, f.is);
    using Row = kiln::Vec<T, 2 * G>;
    pool_quads<G>(load_vec<Row>(x + q.x), load_vec<Row>(x + q.x + t.W), f, y + q.pooled, relu);
  }
}

// An item of the channel path (below): a group of G windows along a row, or one window. Its
// values are loaded before the channel's partials are added up, so the two latencies overlap
// (any window but 2 x 2: at the store).
struct ChannelItem {
#if KILN_POOL_PATH >= 4
  using Row = kiln::Vec<T, 2 * KILN_POOL_GROUP>;
  QuadGroup q;
  Row r0, r1;
  __device__ __forceinline__ void load(const T* __restrict__ x, const PoolTiles& t, long long c, unsigned j,
                                       unsigned per_plane) {
    const unsigned n = j / per_plane;
    q = quad_group_of<KILN_POOL_GROUP>(n * unsigned(t.C) + unsigned(c), j - n * per_plane, t);
    r0 = load_vec<Row>(x + q.x);
    r1 = load_vec<Row>(x + q.x + t.W);
  }
  __device__ __forceinline__ void store(const T* __restrict__, T* __restrict__ y, const Affine& f, const PoolTiles&,
                                        int relu) const {
    pool_quads<KILN_POOL_GROUP>(r0, r1, f, y + q.pooled, relu);
  }
#else
  using I = KILN_POOL_INDEX;
  using G = Tiles<I, KILN_POOL_WINDOW, KILN_POOL_WINDOW>;
  I plane, w;
  Acc xs[4];  // a 2 x 2 window's values in row-major order
  __device__ __forceinline__ void load(const T* __restrict__ x, const PoolTiles& t, long long c, I j, I per_plane) {
    const G g(t);
    const I n = j / per_plane;
    plane = n * g.C + I(c);
    w = j - n * per_plane;
    if constexpr (KILN_POOL_WINDOW == 2) {
      const I oy = w / g.ow, ox = w - oy * g.ow;
      const T* v = x + static_cast<long long>(plane) * g.H * g.W + (2 * oy) * g.W + 2 * ox;
      xs[0] = kiln::cvt<Acc>(v[0]);
      xs[1] = kiln::cvt<Acc>(v[1]);
      xs[2] = kiln::cvt<Acc>(v[g.W]);
      xs[3] = kiln::cvt<Acc>(v[g.W + 1]);
    }
  }
  __device__ __forceinline__ void store(const T* __restrict__ x, T* __restrict__ y, const Affine& f, const PoolTiles& t,
                                        int relu) const {
    const G g(t);
    if constexpr (KILN_POOL_WINDOW == 2)
      kiln::store(y + plane * (g.oh * g.ow) + w, quad_max(xs, f, relu).value);
    else
      pool_window(x, f, y, g, plane, w, relu);
  }
#endif
};

// The sums of a conv's partials of channel c's sums and squares (every thread of the block calls
// it and receives them): parts_sum's order, the two reductions' warps combined at once.
__device__ void channel_parts(const float* __restrict__ parts, long long rows, long long C, long long c, double& sum,
                              double& squares) {
  double s = 0, q = 0;
#pragma unroll 2
  for (long long r = threadIdx.x; r < rows; r += kBlock) {
    s += static_cast<double>(parts[c * rows + r]);
    q += static_cast<double>(parts[(C + c) * rows + r]);
  }
  s = kiln::warp::sum(s);
  q = kiln::warp::sum(q);
  __shared__ double warps[2][kBlock / 32];
  if ((threadIdx.x & 31) == 0) warps[0][threadIdx.x >> 5] = s, warps[1][threadIdx.x >> 5] = q;
  __syncthreads();
  sum = warps[0][0], squares = warps[1][0];
  for (int k = 1; k < kBlock / 32; ++k) sum += warps[0][k], squares += warps[1][k];
}

// Training from a conv's partials (2 * C, rows): block b takes channel c = b / bpc (bpc =
// gridDim.x / C), adds up its partials, then takes the channel's items (windows, or groups of
// them) b % bpc, + bpc, ... kBlock at a time. The channel's first block saves mean and invstd
// and updates the running statistics; block 0 counts the batch.
__device__ void bn_max_pool_channel(const T* __restrict__ x, const P* __restrict__ weight, const P* __restrict__ bias,
                                    const StatsSource& src, const float* __restrict__ parts, long long rows,
                                    T* __restrict__ y, const PoolTiles& t, int relu, long long* tracked,
                                    double momentum) {
  const long long bpc = gridDim.x / t.C, c = blockIdx.x / bpc, part = blockIdx.x % bpc;
#if KILN_POOL_PATH >= 4
  using I = unsigned;
  const I per_plane = quad_groups_per_plane(t, KILN_POOL_GROUP);
#else
  using I = KILN_POOL_INDEX;
  const I per_plane = I(t.oh) * I(t.ow);
#endif
  const I items = I(t.planes / t.C) * per_plane, first = I(part) * I(kBlock) + I(threadIdx.x);
  ChannelItem item;
  if (first < items) item.load(x, t, c, first, per_plane);
  double sum, squares, m, v;
  channel_parts(parts, rows, t.C, c, sum, squares);
  src.moments_of(sum, squares, m, v);
  const Affine f{static_cast<Acc>(m), inv_std(static_cast<Acc>(v), src.eps), weight, bias, c};
  if (part == 0 && threadIdx.x == 0) {
    src.mean[c] = f.mu;
    src.invstd[c] = f.is;
    src.update_running(c, m, v, static_cast<Acc>(momentum));
    if (blockIdx.x == 0 && tracked) *tracked += 1;
  }
  for (I j = first; j < items; j += I(bpc) * I(kBlock)) {
    if (j != first) item.load(x, t, c, j, per_plane);
    item.store(x, y, f, t, relu);
  }
}

// y (N, C, oh, ow), a thread per window or per group of windows along a row (KILN_POOL_PATH):
// the max over each window of the batch norm's (and ReLU's) output. Training reads
// mean/invstd (C), or with `totals` or a conv's `parts` makes them (StatsSource); eval computes
// them from running_mean/var and also writes them for the backward.
extern "C" __global__ void kiln_batch_norm_max_pool(const T* __restrict__ x, const P* __restrict__ weight,
                                                    const P* __restrict__ bias, P* running_mean, P* running_var,
                                                    Acc* mean, Acc* invstd, T* __restrict__ y, PoolTiles t, int eval,
                                                    int relu, double eps, const double* totals, long long* tracked,
                                                    double momentum, const float* __restrict__ parts, long long rows) {
  kiln::wait_prior_grids();
  const StatsSource src{running_mean, running_var, mean, invstd, totals, t.C, t.C > 0 ? t.planes / t.C * t.H * t.W : 0,
                        eval,         eps};
  if (parts) return bn_max_pool_channel(x, weight, bias, src, parts, rows, y, t, relu, tracked, momentum);
  src.publish(tracked, momentum);
#if KILN_POOL_PATH >= 4
  bn_max_pool_quads<KILN_POOL_GROUP>(x, weight, bias, src, y, t, relu);
#else
  bn_max_pool<KILN_POOL_INDEX, KILN_POOL_WINDOW, KILN_POOL_WINDOW>(x, weight, bias, src, y, t, relu);
#endif
}
#endif

#ifdef KILN_ENTRY_kiln_batch_norm_max_pool_backward_reduce
// This block's sums of dy' and dy' * (x - mean) over its windows of channel f.c.
template <class I, int KH, int KW>
__device__ __forceinline__ void bn_max_pool_sums(const T* __restrict__ gp, const T* __restrict__ x, const Affine& f,
                                                 const PoolTiles& t, long long chunk, int splits, int relu, Acc& sdy,
                                                 Acc& sdx) {
  const Tiles<I, KH, KW> g(t);
  const I per_plane = g.oh * g.ow, M = (g.planes / g.C) * per_plane;
  const I first = I(chunk) * I(blockIdx.x % splits), last = first + I(chunk) < M ? first + I(chunk) : M;
#pragma unroll 4
  for (I j = first + I(threadIdx.x); j < last; j += I(kBlock)) {
    const I n = j / per_plane, w = j - n * per_plane, oy = w / g.ow, ox = w - oy * g.ow;
    const long long plane = static_cast<long long>(n) * g.C + f.c;
    const WindowMax<I> m = window_max(x + plane * g.H * g.W, g, oy, ox, f, relu);
    const Acc dy = window_dy(kiln::cvt<Acc>(gp[plane * per_plane + w]), m, relu);
    sdy += dy;
    sdx += dy * (m.x - f.mu);
  }
}

// bn_max_pool_sums over groups of G windows along a row (chunk % G == 0: blocks start at a group).
template <int G>
__device__ __forceinline__ void bn_max_pool_sums_quads(const T* __restrict__ gp, const T* __restrict__ x,
                                                       const Affine& f, const PoolTiles& t, long long chunk, int splits,
                                                       int relu, Acc& sdy, Acc& sdx) {
  using Row = kiln::Vec<T, 2 * G>;
  using Pooled = kiln::Vec<T, G>;
  const unsigned per_plane = quad_groups_per_plane(t, G), M = unsigned(t.planes / t.C) * per_plane;
  const unsigned first = unsigned(chunk / G) * unsigned(blockIdx.x % splits);
  const unsigned last = first + unsigned(chunk / G) < M ? first + unsigned(chunk / G) : M;
#pragma unroll 2
  for (unsigned j = first + threadIdx.x; j < last; j += kBlock) {
    const unsigned n = j / per_plane;
    const QuadGroup q = quad_group_of<G>(n * unsigned(t.C) + unsigned(f.c), j - n * per_plane, t);
    const Row r0 = load_vec<Row>(x + q.x), r1 = load_vec<Row>(x + q.x + t.W);
    const Pooled g = load_vec<Pooled>(gp + q.pooled);
#pragma unroll
    for (int k = 0; k < G; ++k) {
      Acc xs[4];
      quad_values(r0, r1, k, xs);
      const WindowMax<unsigned> m = quad_max(xs, f, relu);
      const Acc dy = window_dy(kiln::cvt<Acc>(g.v[k]), m, relu);
      sdy += dy;
      sdx += dy * (m.x - f.mu);
    }
  }
}

// kiln_batch_norm_backward_reduce for the pooled op, without the merge: each block parks its sums
// of dy' and dy' * (x - mean) over its windows (only an argmax has a dy') in parts (2, C * splits),
// and the dx kernel's blocks add up their channel's. Split as the statistics are: block b takes
// channel b / splits and its windows [chunk * (b % splits), + chunk) of N * oh * ow, a thread one
// window at a time or a group along a row (KILN_POOL_PATH).
extern "C" __global__ void __launch_bounds__(kBlock, 4)
    kiln_batch_norm_max_pool_backward_reduce(const T* __restrict__ gp, const T* __restrict__ x,
                                             const P* __restrict__ weight, const P* __restrict__ bias,
                                             const Acc* __restrict__ mean, const Acc* __restrict__ invstd,
                                             Acc* __restrict__ parts, PoolTiles t, long long chunk, int splits,
                                             int relu) {
  kiln::wait_prior_grids();
  const long long c = blockIdx.x / splits;
  const Affine f{mean[c], invstd[c], weight, bias, c};
  Acc sdy = 0, sdx = 0;
#if KILN_POOL_PATH >= 4
  bn_max_pool_sums_quads<KILN_POOL_GROUP>(gp, x, f, t, chunk, splits, relu, sdy, sdx);
#else
  bn_max_pool_sums<KILN_POOL_INDEX, KILN_POOL_WINDOW, KILN_POOL_WINDOW>(gp, x, f, t, chunk, splits, relu, sdy, sdx);
#endif
  park_backward_sums(sdy, sdx, parts, t.C, splits);
}
#endif

#ifdef KILN_ENTRY_kiln_batch_norm_max_pool_backward_dx
// What dx of channel c takes from the channel's sums: dx = scale * (dy' - mean_dy - (x - mu) *
// is * mean_dyx) in training, scale * dy' in eval.
struct DxTerms {
  Affine f;
  Acc scale, mean_dy, mean_dyx;
  int training, relu;
  __device__ __forceinline__ Acc dx(Acc dy, Acc xv) const {
    Acc d = dy;
    if (training) d = d - mean_dy - (xv - f.mu) * f.is * mean_dyx;
    return scale * d;
  }
};

// dx of one cell of the tiling (oy, ox) of a plane at x + base: a window, or past oh, ow elements
// no window pooled (dy' = 0 there).
template <class I, int KH, int KW>
__device__ __forceinline__ void dx_cell(const T* __restrict__ gp, const T* __restrict__ x, T* __restrict__ dx,
                                        const Tiles<I, KH, KW>& g, I plane, I oy, I ox, const DxTerms& d) {
  const long long base = static_cast<long long>(plane) * g.H * g.W;
  WindowMax<I> m{Acc(0), Acc(0), I(0), false};
  Acc dy = 0;
  if (oy < g.oh && ox < g.ow) {
    m = window_max(x + base, g, oy, ox, d.f, d.relu);
    dy = window_dy(kiln::cvt<Acc>(gp[static_cast<long long>(plane) * g.oh * g.ow + oy * g.ow + ox]), m, d.relu);
  }
  for (I ky = 0, iy = oy * g.kh; ky < g.kh && iy < g.H; ++ky, ++iy)
    for (I kx = 0, ix = ox * g.kw; kx < g.kw && ix < g.W; ++kx, ++ix) {
      const I at = iy * g.W + ix;
      kiln::store(dx + base + at, d.dx(m.found && at == m.at ? dy : Acc(0), kiln::cvt<Acc>(x[base + at])));
    }
}

// dx of a 2 x 2 window from its values xs (row-major) and pooled gradient gv, as d4.
__device__ __forceinline__ void dx_quad(const Acc (&xs)[4], Acc gv, const DxTerms& d, T (&d4)[4]) {
  const WindowMax<unsigned> m = quad_max(xs, d.f, d.relu);
  const Acc dy = window_dy(gv, m, d.relu);
#pragma unroll
  for (unsigned k = 0; k < 4; ++k) d4[k] = kiln::cvt<T>(d.dx(m.found && k == m.at ? dy : Acc(0), xs[k]));
}

// An item of a channel's dx: a group of G windows along a row, or one cell of the tiling. Its
// values are loaded before the channel's sums are added up, so the two latencies overlap (a cell
// of any window but a whole 2 x 2 one: when it is stored).
struct DxItem {
#if KILN_POOL_PATH >= 4
  using Row = kiln::Vec<T, 2 * KILN_POOL_GROUP>;
  using Pooled = kiln::Vec<T, KILN_POOL_GROUP>;
  QuadGroup q;
  Row r0, r1;
  Pooled gv;
  __device__ __forceinline__ void load(const T* __restrict__ gp, const T* __restrict__ x, const PoolTiles& t,
                                       long long c, unsigned j, unsigned per_plane) {
    const unsigned n = j / per_plane;
    q = quad_group_of<KILN_POOL_GROUP>(n * unsigned(t.C) + unsigned(c), j - n * per_plane, t);
    r0 = load_vec<Row>(x + q.x);
    r1 = load_vec<Row>(x + q.x + t.W);
    gv = load_vec<Pooled>(gp + q.pooled);
  }
  __device__ __forceinline__ void store(const T* __restrict__, const T* __restrict__, T* __restrict__ dx,
                                        const PoolTiles& t, const DxTerms& d) const {
    Row o0, o1;
#pragma unroll
    for (int j = 0; j < KILN_POOL_GROUP; ++j) {
      Acc xs[4];
      quad_values(r0, r1, j, xs);
      T d4[4];
      dx_quad(xs, kiln::cvt<Acc>(gv.v[j]), d, d4);
      o0.v[2 * j] = d4[0];
      o0.v[2 * j + 1] = d4[1];
      o1.v[2 * j] = d4[2];
      o1.v[2 * j + 1] = d4[3];
    }
    *reinterpret_cast<Row*>(dx + q.x) = o0;
    *reinterpret_cast<Row*>(dx + q.x + t.W) = o1;
  }
#else
  using I = KILN_POOL_INDEX;
  using G = Tiles<I, KILN_POOL_WINDOW, KILN_POOL_WINDOW>;
  I plane, oy, ox;
  bool whole = false;  // a whole 2 x 2 window, its values in xs and its gradient in gv
  Acc xs[4], gv;
  __device__ __forceinline__ void load(const T* __restrict__ gp, const T* __restrict__ x, const PoolTiles& t,
                                       long long c, I j, I per_plane) {
    const G g(t);
    const I n = j / per_plane, w = j - n * per_plane, cx = (g.W + g.kw - 1) / g.kw;
    plane = n * g.C + I(c);
    oy = w / cx;
    ox = w - oy * cx;
    if constexpr (KILN_POOL_WINDOW == 2) {
      whole = oy < g.oh && ox < g.ow;
      if (whole) {
        const T* v = x + static_cast<long long>(plane) * g.H * g.W + (2 * oy) * g.W + 2 * ox;
        xs[0] = kiln::cvt<Acc>(v[0]);
        xs[1] = kiln::cvt<Acc>(v[1]);
        xs[2] = kiln::cvt<Acc>(v[g.W]);
        xs[3] = kiln::cvt<Acc>(v[g.W + 1]);
        gv = kiln::cvt<Acc>(gp[static_cast<long long>(plane) * g.oh * g.ow + oy * g.ow + ox]);
      }
    }
  }
  __device__ __forceinline__ void store(const T* __restrict__ gp, const T* __restrict__ x, T* __restrict__ dx,
                                        const PoolTiles& t, const DxTerms& d) const {
    const G g(t);
    if (!whole) return dx_cell(gp, x, dx, g, plane, oy, ox, d);
    T d4[4];
    dx_quad(xs, gv, d, d4);
    T* o = dx + static_cast<long long>(plane) * g.H * g.W + (2 * oy) * g.W + 2 * ox;
    kiln::store(o, d4[0]);
    kiln::store(o + 1, d4[1]);
    kiln::store(o + g.W, d4[2]);
    kiln::store(o + g.W + 1, d4[3]);
  }
#endif
};

// Channel c's parked sums (sum dy', sum dy' * xhat), each warp loading up to 32 splits' pairs at
// once and adding them by a butterfly of shuffles: one round trip and five dependent adds, where
// the merge's sum in order took 18 on the speedrun's first layer. Past 32 splits (a conv's input
// gradient parked them, a split per block of its), the block loads up to four pairs a thread at
// once and adds them warp by warp in order. Every lane of every block gets the same bits (each
// butterfly step adds the same two values on both lanes).
__device__ __forceinline__ void channel_sums(const Acc* parts, Acc invstd, long long C, int splits, long long c,
                                             Acc& sdy, Acc& sdx) {
  const int lane = threadIdx.x & 31;
  const Acc* dy = parts + c * splits;
  const Acc* dyx = parts + C * splits + c * splits;
  sdy = 0, sdx = 0;
  if (splits <= 32) {
    const bool in = lane < splits;
    sdy = kiln::warp::sum(in ? __ldcg(dy + lane) : Acc(0));
    sdx = kiln::warp::sum(in ? __ldcg(dyx + lane) : Acc(0));
  } else {
    constexpr int kLoads = 4;
    for (int s0 = 0; s0 < splits; s0 += kLoads * kBlock) {
      Acc a[kLoads], b[kLoads];
#pragma unroll
      for (int r = 0; r < kLoads; ++r) {
        const int s = s0 + r * kBlock + int(threadIdx.x);
        a[r] = s < splits ? __ldcg(dy + s) : Acc(0);
        b[r] = s < splits ? __ldcg(dyx + s) : Acc(0);
      }
#pragma unroll
      for (int r = 0; r < kLoads; ++r) {
        sdy += a[r];
        sdx += b[r];
      }
    }
    sdy = kiln::block::sum<kBlock>(sdy);
    sdx = kiln::block::sum<kBlock>(sdx);
  }
  sdx *= invstd;
}

// dx as kiln_batch_norm_backward_dx, M values per channel, from the reduce blocks' parked sums
// (2, C * splits). Block b takes channel c = b / bpc (bpc = gridDim.x / C), adds up the channel's
// sums, then takes its items (groups of windows along a row, or cells of the tiling: KILN_POOL_PATH)
// b % bpc, + bpc, ... kBlock at a time. The channel's first block writes dbias and dweight (in P,
// when non-null).
extern "C" __global__ void kiln_batch_norm_max_pool_backward_dx(
    const T* __restrict__ gp, const T* __restrict__ x, const P* __restrict__ weight, const P* __restrict__ bias,
    const Acc* __restrict__ mean, const Acc* __restrict__ invstd, const Acc* __restrict__ parts,
    P* __restrict__ dweight, P* __restrict__ dbias, T* __restrict__ dx, PoolTiles t, long long M, int splits,
    int training, int relu) {
  kiln::wait_prior_grids();
  const long long bpc = gridDim.x / t.C, c = blockIdx.x / bpc, part = blockIdx.x % bpc;
#if KILN_POOL_PATH >= 4
  using I = unsigned;
  const I per_plane = quad_groups_per_plane(t, KILN_POOL_GROUP);
#else
  using I = KILN_POOL_INDEX;
  const I per_plane = I((t.H + t.kh - 1) / t.kh) * I((t.W + t.kw - 1) / t.kw);
#endif
  const I items = I(t.planes / t.C) * per_plane, first = I(part) * I(kBlock) + I(threadIdx.x);
  // The channel's constants, the first item's values and the channel's sums: loads issued together.
  const Affine f{mean[c], invstd[c], weight, bias, c};
  const Acc scale = weight ? f.is * kiln::cvt<Acc>(weight[c]) : f.is;
  DxItem item;
  if (first < items) item.load(gp, x, t, c, first, per_plane);
  Acc sdy, sdx;
  channel_sums(parts, f.is, t.C, splits, c, sdy, sdx);
  if (part == 0 && threadIdx.x == 0) {
    if (dbias) kiln::store(dbias + c, sdy);
    if (dweight) kiln::store(dweight + c, sdx);
  }
  const Acc inv_m = Acc(1) / static_cast<Acc>(M);
  const DxTerms d{f, scale, training ? sdy * inv_m : Acc(0), training ? sdx * inv_m : Acc(0), training, relu};
  for (I j = first; j < items; j += I(bpc) * I(kBlock)) {
    if (j != first) item.load(gp, x, t, c, j, per_plane);
    item.store(gp, x, dx, t, d);
  }
}
#endif

// ---- Layer norm over contiguous rows x (rows, K). ----

__device__ unsigned int kiln_ln_params_done;

#ifdef KILN_ENTRY_kiln_layer_norm
// y[r] = (x[r] - mean_r) * invstd_r * weight + bias (weight, bias (K) or null); saves mean and
// invstd (rows). width 32: a warp per row, eight rows per block; width 256: a block per row.
extern "C" __global__ void kiln_layer_norm(const T* __restrict__ x, const P* __restrict__ weight,
                                           const P* __restrict__ bias, T* __restrict__ y, Acc* __restrict__ mean,
                                           Acc* __restrict__ invstd, long long rows, long long K, int width,
                                           double eps) {
  kiln::wait_prior_grids();
  kiln::rows::for_each<kBlock>(rows, width, [&](long long r, bool live, int lane) {
    const T* xr = x + (live ? r : 0) * K;
    const Acc shift = kiln::cvt<Acc>(xr[0]);
    welford::Moments m{0, 0, 0};
    if (live)
      for (long long k = lane; k < K; k += width) welford::push(m, kiln::cvt<Acc>(xr[k]) - shift);
    m = welford::reduce(m, width);
    if (!live) return;
    const Acc mu = shift + checked_mean(m), is = inv_std(m.m2 / static_cast<Acc>(K), eps);
    if (lane == 0) {
      mean[r] = mu;
      invstd[r] = is;
    }
    T* yr = y + r * K;
    for (long long k = lane; k < K; k += width) {
      Acc v = (kiln::cvt<Acc>(xr[k]) - mu) * is;
      if (weight) v *= kiln::cvt<Acc>(weight[k]);
      if (bias) v += kiln::cvt<Acc>(bias[k]);
      kiln::store(yr + k, v);
    }
  });
}
#endif

#ifdef KILN_ENTRY_kiln_layer_norm_backward_dx
// dx[r] = invstd_r * (wg - mean(wg) - xhat * mean(wg * xhat)) with wg = weight * g (g alone
// without weight), rows as kiln_layer_norm.
extern "C" __global__ void kiln_layer_norm_backward_dx(const T* __restrict__ g, const T* __restrict__ x,
                                                       const P* __restrict__ weight, const Acc* __restrict__ mean,
                                                       const Acc* __restrict__ invstd, T* __restrict__ dx,
                                                       long long rows, long long K, int width) {
  kiln::wait_prior_grids();
  kiln::rows::for_each<kBlock>(rows, width, [&](long long r, bool live, int lane) {
    const long long base = (live ? r : 0) * K;
    const Acc mu = live ? mean[r] : Acc(0), is = live ? invstd[r] : Acc(0);
    Acc s1 = 0, s2 = 0;
    if (live)
      for (long long k = lane; k < K; k += width) {
        Acc wg = kiln::cvt<Acc>(g[base + k]);
        if (weight) wg *= kiln::cvt<Acc>(weight[k]);
        s1 += wg;
        s2 += wg * ((kiln::cvt<Acc>(x[base + k]) - mu) * is);
      }
    s1 = kiln::rows::sum<kBlock>(s1, width);
    s2 = kiln::rows::sum<kBlock>(s2, width);
    if (!live) return;
    const Acc inv_k = Acc(1) / static_cast<Acc>(K), m1 = s1 * inv_k, m2 = s2 * inv_k;
    for (long long k = lane; k < K; k += width) {
      Acc wg = kiln::cvt<Acc>(g[base + k]);
      if (weight) wg *= kiln::cvt<Acc>(weight[k]);
      const Acc xhat = (kiln::cvt<Acc>(x[base + k]) - mu) * is;
      kiln::store(dx + base + k, is * (wg - m1 - xhat * m2));
    }
  });
}
#endif

// Column sums of a (rows, K) block, 32 columns and a row range per block: thread (rl, lane) has
// summed rows rl, rl + 8, ... of column k into v[j] for each of kSums sums. Rows combine in order
// in shared memory and splits in order in the last block, which writes out[j] (K each, null: skip).
template <int kSums>
__device__ void finish_column_sums(Acc (&v)[kSums], Acc* parts, unsigned int* done, P* const (&out)[kSums], long long K,
                                   long long k, int split, int splits) {
  const int lane = threadIdx.x & 31, rl = threadIdx.x >> 5;
  __shared__ Acc rows_of[kSums][kBlock / 32][32];
  for (int j = 0; j < kSums; ++j) rows_of[j][rl][lane] = v[j];
  __syncthreads();
  if (rl == 0 && k < K)
    for (int j = 0; j < kSums; ++j) {
      for (int r = 1; r < kBlock / 32; ++r) v[j] += rows_of[j][r][lane];
      if (splits > 1)
        parts[(j * splits + split) * K + k] = v[j];
      else if (out[j])
        kiln::store(out[j] + k, Acc(0) + v[j]);  // the one part as the merge would add it
    }
  // One block a column: nothing to merge, and no counter, so launches may run side by side.
  if (splits == 1 || !kiln::block::last_to_finish(done)) return;
  for (long long col = threadIdx.x; col < K; col += kBlock)
    for (int j = 0; j < kSums; ++j) {
      const Acc a = kiln::block::sum_parked(parts + j * splits * K + col, K, splits);
      if (out[j]) kiln::store(out[j] + col, a);
    }
}

#ifdef KILN_ENTRY_kiln_layer_norm_backward_params
// dweight = sum over rows of g * xhat, dbias = sum of g (K each, in P; either may be null), as a
// column reduction: block b takes 32 columns (tile b / splits) and the rows [rows_per_split *
// (b % splits), + rows_per_split), 8 rows at a time; parts (2, splits, K) are summed in order
// by the last block.
extern "C" __global__ void kiln_layer_norm_backward_params(const T* __restrict__ g, const T* __restrict__ x,
                                                           const Acc* __restrict__ mean,
                                                           const Acc* __restrict__ invstd, Acc* parts,
                                                           P* __restrict__ dweight, P* __restrict__ dbias,
                                                           long long rows, long long K, long long rows_per_split,
                                                           int splits) {
  kiln::wait_prior_grids();
  const int lane = threadIdx.x & 31, rl = threadIdx.x >> 5;
  const int split = blockIdx.x % splits;
  const long long k = static_cast<long long>(blockIdx.x / splits) * 32 + lane;
  const long long first = rows_per_split * split;
  const long long last = first + rows_per_split < rows ? first + rows_per_split : rows;
  Acc sums[2] = {0, 0};
  if (k < K)
    for (long long r = first + rl; r < last; r += kBlock / 32) {
      const Acc gv = kiln::cvt<Acc>(g[r * K + k]);
      sums[0] += gv * ((kiln::cvt<Acc>(x[r * K + k]) - mean[r]) * invstd[r]);
      sums[1] += gv;
    }
  P* const out[2] = {dweight, dbias};
  finish_column_sums(sums, parts, &kiln_ln_params_done, out, K, k, split, splits);
}
#endif

// ---- A narrow linear layer's weight and bias gradients in one kernel (at most 16 outputs, such
// as a classifier's 10): dw (n, K) = g^T x and db (n) = the column sums of g, for g (rows, n) and
// x (rows, K), in P. Block b < gridDim.x - 1 takes x's columns [32 b, 32 b + 32), a lane each,
// and its warps every 8th row, each thread holding n sums; the last block sums g's columns. The
// warps' sums are added in warp order, so every run gives the same bits. With db_below, the column
// sums of `below` (rows, K), the gradient of the layer below's output, go there: that layer's bias
// gradient, summed where x's columns are read anyway. ----

#ifdef KILN_ENTRY_kiln_narrow_linear_grad
extern "C" __global__ void kiln_narrow_linear_grad(const T* __restrict__ g, const T* __restrict__ x,
                                                   const T* __restrict__ below, P* __restrict__ dw, P* __restrict__ db,
                                                   P* __restrict__ db_below, long long rows, int n, long long K) {
  kiln::wait_prior_grids();
  constexpr int kMaxN = 16, kWarps = kBlock / 32;
  __shared__ Acc warp_sums[kWarps][kMaxN + 1][32];  // the last row: below's sums
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bool bias = blockIdx.x == gridDim.x - 1;
  const long long k = static_cast<long long>(blockIdx.x) * 32 + lane;
  Acc sums[kMaxN + 1];
#pragma unroll
  for (int j = 0; j <= kMaxN; ++j) sums[j] = Acc(0);
  if (bias) {
    if (lane < n)
#pragma unroll 8
      for (long long r = warp; r < rows; r += kWarps) sums[0] += kiln::cvt<Acc>(g[r * n + lane]);
  } else if (k < K) {
#pragma unroll 4
    for (long long r = warp; r < rows; r += kWarps) {
      const Acc xv = kiln::cvt<Acc>(x[r * K + k]);
      if (db_below) sums[kMaxN] += kiln::cvt<Acc>(below[r * K + k]);
      const T* gr = g + r * n;  // the same n values for every lane: one broadcast load each
#pragma unroll
      for (int j = 0; j < kMaxN; ++j)
        if (j < n) sums[j] += kiln::cvt<Acc>(gr[j]) * xv;
    }
  }
#pragma unroll
  for (int j = 0; j <= kMaxN; ++j) warp_sums[warp][j][lane] = sums[j];
  __syncthreads();
  for (int o = threadIdx.x; o < (bias ? 32 : (kMaxN + 1) * 32); o += kBlock) {
    const int j = o / 32, l = o % 32;
    if (!bias && j >= n && j < kMaxN) continue;
    Acc v = Acc(0);
    for (int w = 0; w < kWarps; ++w) v += warp_sums[w][j][l];
    const long long col = static_cast<long long>(blockIdx.x) * 32 + l;
    if (bias && l < n) kiln::store(db + l, v);
    if (!bias && col < K) {
      if (j < kMaxN)
        kiln::store(dw + j * K + col, v);
      else if (db_below)
        kiln::store(db_below + col, v);
    }
  }
}
#endif

// ---- A linear layer's bias gradient: the column sums of g (rows, K), in P. With y (the
// layer's ReLU output), g is first masked as relu_backward does (g where y > 0, else 0) and the
// masked gradient written to gp: the ReLU's backward and the bias gradient in one pass. ----

__device__ unsigned int kiln_bias_grad_done;

#ifdef KILN_ENTRY_kiln_bias_grad
// Blocks as kiln_layer_norm_backward_params'; parts (splits, K).
extern "C" __global__ void kiln_bias_grad(const T* __restrict__ g, const T* __restrict__ y, T* __restrict__ gp,
                                          Acc* parts, P* __restrict__ db, long long rows, long long K,
                                          long long rows_per_split, int splits) {
  kiln::wait_prior_grids();
  const int lane = threadIdx.x & 31, rl = threadIdx.x >> 5;
  const int split = blockIdx.x % splits;
  const long long k = static_cast<long long>(blockIdx.x / splits) * 32 + lane;
  const long long first = rows_per_split * split;
  const long long last = first + rows_per_split < rows ? first + rows_per_split : rows;
  Acc sum[1] = {0};
  if (k < K) {
#pragma unroll 4
    for (long long r = first + rl; r < last; r += kBlock / 32) {
      const long long i = r * K + k;
      Acc v = kiln::cvt<Acc>(g[i]);
      if (y) {
        v = kiln::cvt<Acc>(y[i]) > Acc(0) ? v : Acc(0);
        kiln::store(gp + i, v);  // exact: v is g's value or zero
      }
      sum[0] += v;
    }
  }
  P* const out[1] = {db};
  finish_column_sums(sum, parts, &kiln_bias_grad_done, out, K, k, split, splits);
}
#endif
