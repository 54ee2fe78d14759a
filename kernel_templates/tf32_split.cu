// x = hi + lo in TF32, pasted after the prelude (TF32_SPLIT) by the tile engine (gemm_wgmma.cu,
// which splits f32 tiles itself) and its staging kernels (gemm_staging.cu, which store the
// slices): hi is the TF32 rounding of x (truncated where rounding would overflow) and lo that of
// the rest, so that TF32 MMAs read both exactly. A non-finite x has lo 0; its hi must meet the
// other operand's lo as 0 (hf), or inf * 0 would give NaN.
__device__ __forceinline__ float tf32_round(float x) {
  unsigned u;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(x));
  return __uint_as_float(u);
}
// Splits x; `odd` becomes true where x is not finite.
__device__ __forceinline__ void split_f32(float x, float& hi, float& lo, bool& odd) {
  hi = tf32_round(x);
  lo = tf32_round(x - hi);
  if (!isfinite(hi)) {  // rare: x is inf or NaN, or rounds past the largest float
    odd = odd || !isfinite(x);
    hi = isfinite(x) ? __uint_as_float(__float_as_uint(x) & 0xffffe000u) : x;
    lo = isfinite(x) ? tf32_round(x - hi) : 0.f;
  }
}
__device__ __forceinline__ float finite_or_zero(float x) { return isfinite(x) ? x : 0.f; }
