// The pooled batch norm's windows, pasted (BN_POOL_WINDOW) into norm.cu and into the kernels
// whose epilogue sums its backward (conv_patch.cu's POOL_SUMS): a value as batch_norm_apply
// stores it, the max that max_pool2d takes and the gradient its argmax gets, in the same
// arithmetic wherever they run. Needs T (x's storage type), P (the parameters') and Acc.

// The per-channel constants of the batch norm's output.
struct Affine {
  Acc mu, is;
  const P* weight;
  const P* bias;
  long long c;
};

// A value as batch_norm_apply stores it (rounded to T), back in Acc.
__device__ __forceinline__ Acc bn_stored(Acc xv, const Affine& f, int relu) {
  Acc v = (xv - f.mu) * f.is;
  if (f.weight) v *= kiln::cvt<Acc>(f.weight[f.c]);
  if (f.bias) v += kiln::cvt<Acc>(f.bias[f.c]);
  if (relu) v = kiln::math::relu(v);
  return kiln::cvt<Acc>(kiln::cvt<T>(v));
}

// A window's max as max_pool2d takes it (the first maximum in row-major order; a NaN wins and
// ends the search): its value, its offset (in the plane, or 0-3 in a 2 x 2 window) and x there.
template <class I>
struct WindowMax {
  Acc value, x;
  I at;
  bool found;
};
// Offers a window's values in row-major order, keeping what max_pool2d takes.
template <class I>
struct MaxScan {
  WindowMax<I> best{Acc(0), Acc(0), I(0), false};
  bool nan_seen = false;
  __device__ __forceinline__ void offer(I at, Acc xv, const Affine& f, int relu) {
    const Acc v = bn_stored(xv, f, relu);
    if (nan_seen || !(!best.found || v > best.value || v != v)) return;
    best = {v, xv, at, true};
    nan_seen = v != v;
  }
};

// The max of a 2 x 2 window from its values xs in row-major order, `at` its place (0-3).
__device__ __forceinline__ WindowMax<unsigned> quad_max(const Acc (&xs)[4], const Affine& f, int relu) {
  MaxScan<unsigned> scan;
#pragma unroll
  for (unsigned k = 0; k < 4; ++k) scan.offer(k, xs[k], f, relu);
  return scan.best;
}

// dy' of a window whose max is m: the pooled gradient where the stored max is positive (always
// without the ReLU); every other element's dy' is 0.
template <class I>
__device__ __forceinline__ Acc window_dy(Acc g, const WindowMax<I>& m, int relu) {
  return relu && !(m.value > Acc(0)) ? Acc(0) : g;
}
