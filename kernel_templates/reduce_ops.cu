// Wrapping integer arithmetic and the reduction ops of reduce.cu, pasted in at its OPS placeholder: each op is a
// struct template over the accumulator type with identity, update (one element and its
// index along r), combine (two states; commutative, so any tree order is valid) and
// finalize (n = elements reduced). Sees In, Out, Acc and kVec from reduce.cu.

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

// A bool counts as x ? 1 : 0, tested as a byte (a static_cast would trust the byte to be 0 or 1).
template <class T> __device__ __forceinline__ Acc to_acc(T x) {
  if constexpr (kiln::is_same<T, bool>::value) return x ? Acc(1) : Acc(0);
  else return kiln::cvt<Acc>(x);
}

// ---- ops
template <class A> struct SumOp {
  typedef A State;
  static __device__ State identity() { return A(0); }
  static __device__ void update(State& s, A x, long long) { s = add_(s, x); }
  static __device__ State combine(State a, State b) { return add_(a, b); }
  static __device__ Out finalize(State s, long long, double) { return kiln::cvt<Out>(s); }
};

template <class A> struct MeanOp : SumOp<A> {
  static __device__ Out finalize(A s, long long n, double) { return kiln::cvt<Out>(s / static_cast<A>(n)); }
};

template <class A> struct ProdOp {
  typedef A State;
  static __device__ State identity() { return A(1); }
  static __device__ void update(State& s, A x, long long) { s = mul_(s, x); }
  static __device__ State combine(State a, State b) { return mul_(a, b); }
  static __device__ Out finalize(State s, long long, double) { return kiln::cvt<Out>(s); }
};

template <class A> struct MaxOp {
  typedef A State;
  static __device__ State identity() { return kiln::Lim<A>::lowest(); }
  static __device__ void update(State& s, A x, long long) { s = kiln::math::maximum(s, x); }
  static __device__ State combine(State a, State b) { return kiln::math::maximum(a, b); }
  static __device__ Out finalize(State s, long long, double) { return kiln::cvt<Out>(s); }
};

template <class A> struct MinOp {
  typedef A State;
  static __device__ State identity() { return kiln::Lim<A>::highest(); }
  static __device__ void update(State& s, A x, long long) { s = kiln::math::minimum(s, x); }
  static __device__ State combine(State a, State b) { return kiln::math::minimum(a, b); }
  static __device__ Out finalize(State s, long long, double) { return kiln::cvt<Out>(s); }
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
    s.v = kMax ? kiln::Lim<A>::lowest() : kiln::Lim<A>::highest();
    s.i = kiln::Lim<long long>::highest();
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
  static __device__ Out finalize(State s, long long n, double c) { return kiln::cvt<Out>(variance(s, n, c)); }
};

template <class A> struct StdOp : VarOp<A> {
  static __device__ Out finalize(VarState<A> s, long long n, double c) {
    return kiln::cvt<Out>(kiln::math::sqrt(VarOp<A>::variance(s, n, c)));
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
    s.m = kiln::Lim<A>::lowest();
    s.s = A(0);
    return s;
  }
  static __device__ State combine(State a, State b) {
    State r;
    r.m = kiln::math::maximum(a.m, b.m);
    if (!(r.m > kiln::Lim<A>::lowest() && r.m < kiln::Lim<A>::highest())) {
      r.s = A(0);
      return r;
    }
    r.s = a.m < b.m ? b.s + a.s * kiln::math::exp(a.m - b.m) : a.s + b.s * kiln::math::exp(b.m - a.m);
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
    for (int j = 0; j < kVec; ++j) m = kiln::math::maximum(m, x[j]);
    if (!(m > kiln::Lim<A>::lowest() && m < kiln::Lim<A>::highest())) {
      s.m = m;
      s.s = A(0);
      return;
    }
    if (m > s.m) {
      s.s *= kiln::math::exp(s.m - m);
      s.m = m;
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) s.s += kiln::math::exp(x[j] - m);
  }
  static __device__ Out finalize(State s, long long, double) {
    bool finite = s.m > kiln::Lim<A>::lowest() && s.m < kiln::Lim<A>::highest();
    return kiln::cvt<Out>(finite ? s.m + kiln::math::log(s.s) : s.m);
  }
};
