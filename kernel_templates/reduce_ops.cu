// Numbers and the reduction ops of reduce.cu, pasted in at its OPS placeholder: each op is a
// struct template over the accumulator type with identity, update (one element and its
// index along r), combine (two states; commutative, so any tree order is valid) and
// finalize (n = elements reduced). Sees In, Out, Acc and kVec from reduce.cu.

// ---- numbers (NVRTC has no <limits>)
template <class T> struct Lim;
template <> struct Lim<float> {
  static __device__ float lowest() { return __int_as_float(0xff800000); }  // -inf
  static __device__ float highest() { return __int_as_float(0x7f800000); }
  static __device__ float nan() { return __int_as_float(0x7fffffff); }
};
template <> struct Lim<double> {
  static __device__ double lowest() { return __longlong_as_double(0xfff0000000000000ULL); }
  static __device__ double highest() { return __longlong_as_double(0x7ff0000000000000ULL); }
  static __device__ double nan() { return __longlong_as_double(0x7fffffffffffffffULL); }
};
template <> struct Lim<long long> {
  static __device__ long long lowest() { return -9223372036854775807LL - 1; }
  static __device__ long long highest() { return 9223372036854775807LL; }
};

__device__ __forceinline__ float exp_(float x) { return expf(x); }
__device__ __forceinline__ double exp_(double x) { return exp(x); }
__device__ __forceinline__ float log_(float x) { return logf(x); }
__device__ __forceinline__ double log_(double x) { return log(x); }
__device__ __forceinline__ float sqrt_(float x) { return sqrtf(x); }
__device__ __forceinline__ double sqrt_(double x) { return sqrt(x); }

// Integer sums and products wrap like PyTorch's instead of being undefined.
__device__ __forceinline__ float add_(float a, float b) { return a + b; }
__device__ __forceinline__ double add_(double a, double b) { return a + b; }
__device__ __forceinline__ long long add_(long long a, long long b) {
  return (long long)((unsigned long long)a + (unsigned long long)b);
}
__device__ __forceinline__ float mul_(float a, float b) { return a * b; }
__device__ __forceinline__ double mul_(double a, double b) { return a * b; }
__device__ __forceinline__ long long mul_(long long a, long long b) {
  return (long long)((unsigned long long)a * (unsigned long long)b);
}

// NaN wins, as in PyTorch (x != x is false for integers).
__device__ __forceinline__ Acc max_(Acc a, Acc b) { return (a != a || a > b) ? a : b; }
__device__ __forceinline__ Acc min_(Acc a, Acc b) { return (a != a || a < b) ? a : b; }

template <class T> __device__ __forceinline__ Acc to_acc(T x) { return static_cast<Acc>(x); }
template <> __device__ __forceinline__ Acc to_acc<bool>(bool x) { return x ? Acc(1) : Acc(0); }
template <class T> __device__ __forceinline__ T from_acc(Acc x) { return static_cast<T>(x); }
template <> __device__ __forceinline__ bool from_acc<bool>(Acc x) { return x != Acc(0); }
#ifdef __CUDA_FP16_H__
template <> __device__ __forceinline__ Acc to_acc<__half>(__half x) { return static_cast<Acc>(__half2float(x)); }
template <> __device__ __forceinline__ __half from_acc<__half>(Acc x) { return __float2half_rn(static_cast<float>(x)); }
#endif
#ifdef __CUDA_BF16_H__
template <> __device__ __forceinline__ Acc to_acc<__nv_bfloat16>(__nv_bfloat16 x) {
  return static_cast<Acc>(__bfloat162float(x));
}
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(Acc x) {
  return __float2bfloat16_rn(static_cast<float>(x));
}
#endif

// ---- ops
template <class A> struct SumOp {
  typedef A State;
  static __device__ State identity() { return A(0); }
  static __device__ void update(State& s, A x, long long) { s = add_(s, x); }
  static __device__ State combine(State a, State b) { return add_(a, b); }
  static __device__ Out finalize(State s, long long, double) { return from_acc<Out>(s); }
};

template <class A> struct MeanOp : SumOp<A> {
  static __device__ Out finalize(A s, long long n, double) { return from_acc<Out>(s / static_cast<A>(n)); }
};

template <class A> struct ProdOp {
  typedef A State;
  static __device__ State identity() { return A(1); }
  static __device__ void update(State& s, A x, long long) { s = mul_(s, x); }
  static __device__ State combine(State a, State b) { return mul_(a, b); }
  static __device__ Out finalize(State s, long long, double) { return from_acc<Out>(s); }
};

template <class A> struct MaxOp {
  typedef A State;
  static __device__ State identity() { return Lim<A>::lowest(); }
  static __device__ void update(State& s, A x, long long) { s = max_(s, x); }
  static __device__ State combine(State a, State b) { return max_(a, b); }
  static __device__ Out finalize(State s, long long, double) { return from_acc<Out>(s); }
};

template <class A> struct MinOp {
  typedef A State;
  static __device__ State identity() { return Lim<A>::highest(); }
  static __device__ void update(State& s, A x, long long) { s = min_(s, x); }
  static __device__ State combine(State a, State b) { return min_(a, b); }
  static __device__ Out finalize(State s, long long, double) { return from_acc<Out>(s); }
};

template <class A> struct ArgState {
  A v;
  long long i;
};

// kMax: the largest value wins, else the smallest. NaN beats everything; ties go to the
// first occurrence, which makes the result independent of the combine order.
template <class A, bool kMax> struct ArgOp {
  typedef ArgState<A> State;
  static __device__ State identity() {
    State s;
    s.v = kMax ? Lim<A>::lowest() : Lim<A>::highest();
    s.i = Lim<long long>::highest();
    return s;
  }
  static __device__ bool beats(const State& a, const State& b) {
    bool an = a.v != a.v, bn = b.v != b.v;
    if (an || bn) return an && (!bn || a.i < b.i);
    if (a.v != b.v) return kMax ? a.v > b.v : a.v < b.v;
    return a.i < b.i;
  }
  static __device__ void update(State& s, A x, long long idx) {
    State c;
    c.v = x;
    c.i = idx;
    if (beats(c, s)) s = c;
  }
  static __device__ State combine(State a, State b) { return beats(a, b) ? a : b; }
  static __device__ Out finalize(State s, long long, double) { return static_cast<Out>(s.i); }
};
template <class A> struct ArgMaxOp : ArgOp<A, true> {};
template <class A> struct ArgMinOp : ArgOp<A, false> {};

template <class A> struct VarState {
  A n, mean, m2;
};

// Welford per element, Chan et al. to combine; param is the correction (0 or 1).
template <class A> struct VarOp {
  typedef VarState<A> State;
  static __device__ State identity() {
    State s;
    s.n = s.mean = s.m2 = A(0);
    return s;
  }
  static __device__ void update(State& s, A x, long long) {
    s.n += A(1);
    A d = x - s.mean;
    s.mean += d / s.n;
    s.m2 += d * (x - s.mean);
  }
  // A whole vector: its own mean and M2 in two passes, then one Chan step (one division).
  static __device__ void update_batch(State& s, const A* x, long long) {
    State b;
    A sum = A(0);
#pragma unroll
    for (int j = 0; j < kVec; ++j) sum += x[j];
    b.n = A(kVec);
    b.mean = sum * (A(1) / A(kVec));
    b.m2 = A(0);
#pragma unroll
    for (int j = 0; j < kVec; ++j) b.m2 += (x[j] - b.mean) * (x[j] - b.mean);
    s = combine(s, b);
  }
  static __device__ State combine(State a, State b) {
    if (b.n == A(0)) return a;
    if (a.n == A(0)) return b;
    State s;
    s.n = a.n + b.n;
    A d = b.mean - a.mean, w = b.n / s.n;
    s.mean = a.mean + d * w;
    s.m2 = a.m2 + b.m2 + d * d * a.n * w;
    return s;
  }
  static __device__ A variance(State s, long long n, double correction) {
    double dof = static_cast<double>(n) - correction;
    return s.m2 / static_cast<A>(dof > 0 ? dof : 0.0);
  }
  static __device__ Out finalize(State s, long long n, double c) { return from_acc<Out>(variance(s, n, c)); }
};

template <class A> struct StdOp : VarOp<A> {
  static __device__ Out finalize(VarState<A> s, long long n, double c) {
    return from_acc<Out>(sqrt_(VarOp<A>::variance(s, n, c)));
  }
};

template <class A> struct LseState {
  A m, s;  // running max and sum of exp(x - m)
};

// A non-finite max (NaN, +inf, or -inf when every element is -inf) is the answer.
template <class A> struct LogSumExpOp {
  typedef LseState<A> State;
  static __device__ State identity() {
    State s;
    s.m = Lim<A>::lowest();
    s.s = A(0);
    return s;
  }
  static __device__ State combine(State a, State b) {
    State r;
    r.m = max_(a.m, b.m);
    if (!(r.m > Lim<A>::lowest() && r.m < Lim<A>::highest())) {
      r.s = A(0);
      return r;
    }
    r.s = a.m < b.m ? b.s + a.s * exp_(a.m - b.m) : a.s + b.s * exp_(b.m - a.m);
    return r;
  }
  static __device__ void update(State& s, A x, long long) {
    State e;
    e.m = x;
    e.s = A(1);
    s = combine(s, e);
  }
  // A whole vector: rescale at most once, then one exp per element.
  static __device__ void update_batch(State& s, const A* x, long long) {
    A m = s.m;
#pragma unroll
    for (int j = 0; j < kVec; ++j) m = max_(m, x[j]);
    if (!(m > Lim<A>::lowest() && m < Lim<A>::highest())) {
      s.m = m;
      s.s = A(0);
      return;
    }
    if (m > s.m) {
      s.s *= exp_(s.m - m);
      s.m = m;
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) s.s += exp_(x[j] - m);
  }
  static __device__ Out finalize(State s, long long, double) {
    bool finite = s.m > Lim<A>::lowest() && s.m < Lim<A>::highest();
    return from_acc<Out>(finite ? s.m + log_(s.s) : s.m);
  }
};
