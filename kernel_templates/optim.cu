// Fused optimizer updates over contiguous parameters and their gradients, one launch for up to
// 32 parameters of one dtype. T is the parameter's storage type; S is the state and compute type (float for
// f16/bf16/f32, double for f64). Host scalars arrive as double and are rounded to S once per
// thread; those that change per step (lr, bias corrections) are read from device memory at
// `step`, which the optimizer writes before its updates, so a replayed CUDA graph sees new
// values. `skip` (a GradScaler's found-inf flag, or null: never skip) is read on the device too,
// so a captured step skips an update after inf/NaN gradients without the host. An op's module
// holds only its own entry (#ifdef KILN_ENTRY_<name>, defined by the runtime). NVRTC
// -std=c++17, no C++ library.
${PRELUDE}
KILN_KERNELS_WAIT_FOR_PRIOR_GRIDS
typedef ${T} T;
typedef ${S} S;

// One launch updates up to 32 parameters of one dtype: block b works on the tensor t with
// first_block[t] <= b < first_block[t + 1], elements [(b - first_block[t]) * kChunk, +kChunk).
// s0/s1 are the state arrays (SGD: the momentum buffer or 0; Adam: exp_avg, exp_avg_sq).
#define KILN_MAX_TENSORS 32
#define KILN_CHUNK 1024LL
// A thread's values of a chunk are loaded together before any is updated: one memory latency
// per four values, not one per value (the updates were latency-bound at 4096 a block).
#define KILN_PER_THREAD 4

// A gradient given as a split's f32 rows (ws: rows x n, row-major; rows > 0) is their column
// sums: its blocks take 32 columns each, sum them as the split's own reduce does (row_sums.cu,
// the same order, so the same bits), store them to g, and update those elements.
#define KILN_SPLIT_COLUMNS 32LL

struct TensorList {
  unsigned long long p[KILN_MAX_TENSORS], g[KILN_MAX_TENSORS], s0[KILN_MAX_TENSORS], s1[KILN_MAX_TENSORS];
  unsigned long long lp[KILN_MAX_TENSORS];  // autocast's copy of the parameter, or 0
  unsigned long long ws[KILN_MAX_TENSORS];  // the gradient's split rows, or 0
  long long n[KILN_MAX_TENSORS];
  long long first_block[KILN_MAX_TENSORS + 1];
  int flags[KILN_MAX_TENSORS];  // SGD: 1 on the buffer's first step
  int lp_kind[KILN_MAX_TENSORS];  // lp's dtype: 1 f16, 2 bf16
  int rows[KILN_MAX_TENSORS];     // ws's rows, or 0
  int count;
};

struct Span {
  int t;
  long long begin, end;
};

__device__ __forceinline__ Span block_span(const TensorList& L) {
  const long long b = blockIdx.x;
  int t = 0;
  while (t + 1 < L.count && L.first_block[t + 1] <= b) ++t;
  const long long per = L.rows[t] > 0 ? KILN_SPLIT_COLUMNS : KILN_CHUNK;
  const long long begin = (b - L.first_block[t]) * per;
  const long long end = begin + per < L.n[t] ? begin + per : L.n[t];
  return {t, begin, end};
}

${ROW_SUMS}
// Every thread of a split tensor's block calls it: the gradient of element sp.begin + lane,
// stored to g by the first warp (also when the update is skipped).
__device__ __forceinline__ T split_gradient(const TensorList& L, const Span& sp) {
  const long long i = sp.begin + threadIdx.x % 32;
  const float sum = kiln_column_sum<256>(reinterpret_cast<const float*>(L.ws[sp.t]), L.n[sp.t], L.rows[sp.t], i);
  const T gi = kiln::cvt<T>(sum);
  if (threadIdx.x < 32 && i < sp.end) kiln::store(reinterpret_cast<T*>(L.g[sp.t]) + i, gi);
  return gi;
}

// Rounded f32/f64 arithmetic the compiler may not contract into FMAs: it would pick which
// products to fuse per code path, and both paths of an update must round alike.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }

// The updated parameter (as stored) into autocast's copy, rounded as a cast rounds it, so the
// next forward reads it instead of casting the weight. Every optim spec binds both half headers.
__device__ __forceinline__ void store_low_precision(const TensorList& L, int t, long long i, T v) {
  if (L.lp_kind[t] == 2) kiln::store(reinterpret_cast<__nv_bfloat16*>(L.lp[t]) + i, v);
  else if (L.lp_kind[t] == 1) kiln::store(reinterpret_cast<__half*>(L.lp[t]) + i, v);
}

// PyTorch's SGD. g += wd*p; with momentum (buf != null): b = first ? g : momentum*b +
// (1-dampening)*g, g = nesterov ? g + momentum*b : b. Then p -= lr*g, lr = step[0]. Both paths
// of the kernel update an element here, so they make the same bits.
struct SgdScalars {
  S lr, mom, keep, wd;
  bool decay, nesterov;
};

// One element: p, g as loaded, b the momentum buffer's value (read unless first); the buffer's
// new value in b. Returns the new parameter as stored.
__device__ __forceinline__ T sgd_element(const SgdScalars& c, bool momentum, bool first, S pi, S gi, S& b) {
  if (c.decay) gi = add_rn(gi, mul_rn(c.wd, pi));
  if (momentum) {
    b = first ? gi : add_rn(mul_rn(c.mom, b), mul_rn(c.keep, gi));
    gi = c.nesterov ? add_rn(gi, mul_rn(c.mom, b)) : b;
  }
  return kiln::cvt<T>(add_rn(pi, -mul_rn(c.lr, gi)));
}

#ifdef KILN_ENTRY_kiln_sgd_step
extern "C" __global__ void __launch_bounds__(256)
kiln_sgd_step(TensorList L, const double* __restrict__ step, const float* __restrict__ skip, double momentum,
              double dampening, double weight_decay, int nesterov) {
  kiln::wait_prior_grids();
  const Span sp = block_span(L);
  const bool split = L.rows[sp.t] > 0;
  const T split_g = split ? split_gradient(L, sp) : T{};
  if (skip != nullptr && *skip != 0.f) return;
  T* __restrict__ p = reinterpret_cast<T*>(L.p[sp.t]);
  const T* __restrict__ g = reinterpret_cast<const T*>(L.g[sp.t]);
  S* __restrict__ buf = reinterpret_cast<S*>(L.s0[sp.t]);
  const bool first_step = L.flags[sp.t] != 0, with_buf = buf != nullptr;
  const SgdScalars c{static_cast<S>(step[0]), static_cast<S>(momentum), static_cast<S>(1.0 - dampening),
                     static_cast<S>(weight_decay), weight_decay != 0.0, nesterov != 0};
  if (split) {
    const long long i = sp.begin + threadIdx.x;
    if (threadIdx.x >= 32 || i >= sp.end) return;
    S b = with_buf && !first_step ? buf[i] : S{};
    const T updated = sgd_element(c, with_buf, first_step, kiln::cvt<S>(p[i]), kiln::cvt<S>(split_g), b);
    if (with_buf) buf[i] = b;
    kiln::store(p + i, updated);
    store_low_precision(L, sp.t, i, updated);
    return;
  }
  for (long long first = sp.begin + threadIdx.x; first < sp.end; first += KILN_PER_THREAD * blockDim.x) {
    S pv[KILN_PER_THREAD] = {}, gv[KILN_PER_THREAD] = {}, bv[KILN_PER_THREAD] = {};
#pragma unroll
    for (int k = 0; k < KILN_PER_THREAD; ++k) {
      const long long i = first + k * blockDim.x;
      if (i >= sp.end) break;
      pv[k] = kiln::cvt<S>(p[i]);
      gv[k] = kiln::cvt<S>(g[i]);
      if (with_buf && !first_step) bv[k] = buf[i];
    }
#pragma unroll
    for (int k = 0; k < KILN_PER_THREAD; ++k) {
      const long long i = first + k * blockDim.x;
      if (i >= sp.end) break;
      const T updated = sgd_element(c, with_buf, first_step, pv[k], gv[k], bv[k]);
      if (with_buf) buf[i] = bv[k];
      kiln::store(p + i, updated);
      store_low_precision(L, sp.t, i, updated);
    }
  }
}
#endif

// Adam / AdamW. step = {lr, bc1 = 1 - beta1^t, bc2 = 1 - beta2^t}, computed by the host in double.
// decoupled: p *= 1 - lr*wd first (AdamW); else g += wd*p (Adam's L2). Then
// m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2; p -= (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps),
// the order PyTorch's single-tensor Adam evaluates it in. Both paths of the kernel update an
// element here, so they make the same bits.
struct AdamScalars {
  S b1, one_b1, b2, one_b2, eps, step_size, bc2_sqrt, decay, l2;
  bool decoupled, l2_on;
};

__device__ __forceinline__ AdamScalars adam_scalars(const double* __restrict__ step, double beta1, double beta2,
                                                    double eps, double weight_decay, int decoupled) {
  const double lr = step[0], bc1 = step[1], bc2 = step[2];
  AdamScalars a;
  a.b1 = static_cast<S>(beta1);
  a.one_b1 = static_cast<S>(1.0 - beta1);
  a.b2 = static_cast<S>(beta2);
  a.one_b2 = static_cast<S>(1.0 - beta2);
  a.eps = static_cast<S>(eps);
  a.step_size = static_cast<S>(lr / bc1);
  a.bc2_sqrt = static_cast<S>(sqrt(bc2));
  a.decay = static_cast<S>(decoupled ? 1.0 - lr * weight_decay : 1.0);
  a.l2 = static_cast<S>(decoupled ? 0.0 : weight_decay);
  a.decoupled = decoupled != 0;
  a.l2_on = weight_decay != 0.0;
  return a;
}

// One element: p, g as loaded; m and v updated in place. Returns the new parameter as stored.
__device__ __forceinline__ T adam_element(const AdamScalars& a, S pi, S gi, S& m, S& v) {
  if (a.decoupled) pi = mul_rn(pi, a.decay);
  else if (a.l2_on) gi = add_rn(gi, mul_rn(a.l2, pi));
  const S mi = add_rn(mul_rn(a.b1, m), mul_rn(a.one_b1, gi));
  const S vi = add_rn(mul_rn(a.b2, v), mul_rn(mul_rn(a.one_b2, gi), gi));
  m = mi;
  v = vi;
  const S denom = add_rn(kiln::math::sqrt(vi) / a.bc2_sqrt, a.eps);
  return kiln::cvt<T>(add_rn(pi, -(mul_rn(a.step_size, mi) / denom)));
}

#ifdef KILN_ENTRY_kiln_adam_step
extern "C" __global__ void __launch_bounds__(256)
kiln_adam_step(TensorList L, const double* __restrict__ step, const float* __restrict__ skip, double beta1,
               double beta2, double eps, double weight_decay, int decoupled) {
  kiln::wait_prior_grids();
  const Span sp = block_span(L);
  const bool split = L.rows[sp.t] > 0;
  const T split_g = split ? split_gradient(L, sp) : T{};
  if (skip != nullptr && *skip != 0.f) return;
  T* __restrict__ p = reinterpret_cast<T*>(L.p[sp.t]);
  const T* __restrict__ g = reinterpret_cast<const T*>(L.g[sp.t]);
  S* __restrict__ m = reinterpret_cast<S*>(L.s0[sp.t]);
  S* __restrict__ v = reinterpret_cast<S*>(L.s1[sp.t]);
  const AdamScalars a = adam_scalars(step, beta1, beta2, eps, weight_decay, decoupled);
  if (split) {
    const long long i = sp.begin + threadIdx.x;
    if (threadIdx.x >= 32 || i >= sp.end) return;
    S mi = m[i], vi = v[i];
    const T updated = adam_element(a, kiln::cvt<S>(p[i]), kiln::cvt<S>(split_g), mi, vi);
    m[i] = mi;
    v[i] = vi;
    kiln::store(p + i, updated);
    store_low_precision(L, sp.t, i, updated);
    return;
  }
  for (long long first = sp.begin + threadIdx.x; first < sp.end; first += KILN_PER_THREAD * blockDim.x) {
    S pv[KILN_PER_THREAD] = {}, gv[KILN_PER_THREAD] = {}, mv[KILN_PER_THREAD] = {}, vv[KILN_PER_THREAD] = {};
#pragma unroll
    for (int k = 0; k < KILN_PER_THREAD; ++k) {
      const long long i = first + k * blockDim.x;
      if (i >= sp.end) break;
      pv[k] = kiln::cvt<S>(p[i]);
      gv[k] = kiln::cvt<S>(g[i]);
      mv[k] = m[i];
      vv[k] = v[i];
    }
#pragma unroll
    for (int k = 0; k < KILN_PER_THREAD; ++k) {
      const long long i = first + k * blockDim.x;
      if (i >= sp.end) break;
      const T updated = adam_element(a, pv[k], gv[k], mv[k], vv[k]);
      m[i] = mv[k];
      v[i] = vv[k];
      kiln::store(p + i, updated);
      store_low_precision(L, sp.t, i, updated);
    }
  }
}
#endif

__device__ __forceinline__ bool finite(float x) { return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u; }
__device__ __forceinline__ bool finite(double x) {
  return (__double_as_longlong(x) & 0x7ff0000000000000LL) != 0x7ff0000000000000LL;
}

#ifdef KILN_ENTRY_kiln_unscale_grads
// GradScaler's unscale: every gradient g (L.g, in place) becomes g / scale; found_inf becomes 1
// when any g was inf or NaN before it (found_inf is zeroed before the first launch of a step).
extern "C" __global__ void __launch_bounds__(256)
kiln_unscale_grads(TensorList L, const float* __restrict__ scale, float* __restrict__ found_inf) {
  kiln::wait_prior_grids();
  const Span sp = block_span(L);
  T* __restrict__ g = reinterpret_cast<T*>(L.g[sp.t]);
  const S inv = static_cast<S>(1.0 / static_cast<double>(*scale));  // exact for powers of two
  bool bad = false;
  for (long long i = sp.begin + threadIdx.x; i < sp.end; i += blockDim.x) {
    const S gi = kiln::cvt<S>(g[i]);
    bad |= !finite(gi);
    kiln::store(g + i, gi * inv);
  }
  if (bad) *found_inf = 1.f;
}
#endif

#ifdef KILN_ENTRY_kiln_update_scale
// GradScaler's update, one thread (torch's _amp_update_scale_): after inf/NaN the scale backs
// off and the count of clean steps restarts; after `interval` clean steps it grows (unless that
// would overflow f32).
extern "C" __global__ void kiln_update_scale(float* scale, long long* clean_steps, const float* found_inf,
                                             double growth, double backoff, long long interval) {
  kiln::wait_prior_grids();
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  if (*found_inf != 0.f) {
    *scale = static_cast<float>(*scale * backoff);
    *clean_steps = 0;
    return;
  }
  const long long n = *clean_steps + 1;
  if (n < interval) {
    *clean_steps = n;
    return;
  }
  const float grown = static_cast<float>(*scale * growth);
  if (finite(grown)) *scale = grown;
  *clean_steps = 0;
}
#endif
