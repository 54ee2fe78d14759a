// What every implicit-GEMM convolution template shares, pasted (CONV_COMMON) once MODE, the
// sizes N..DW, G, BM, BN, SPLITK, THREADS, CLD, TA, TB, TO and kiln_conv_tiles are defined: the GEMM view of the
// pass (MODE 0 forward, 1 dgrad, 2 wgrad), gathering A and B from NCHW/OIHW memory, and the
// end of a tile: split-K sums and the store.
constexpr int CG = C / G, OG = O / G, RS = KH * KW, OHW = OH * OW, HW = H * W;
constexpr int GM = MODE == 0 ? N * OHW : MODE == 1 ? N * HW : OG;
constexpr int GN = MODE == 0 ? OG : MODE == 1 ? CG : CG * RS;
constexpr int GK = MODE == 0 ? CG * RS : MODE == 1 ? OG * RS : N * OHW;


// Element (m, k) of A and (k, n) of B for group g as f32; 0 outside the problem or padding.
__device__ __forceinline__ float load_a(const TA* __restrict__ a, int g, int m, int k) {
  if (m >= GM || k >= GK) return 0.f;
#if MODE == 0
  const int img = m / OHW, p = m % OHW, c = k / RS, rs = k % RS;
  const int iy = (p / OW) * SH - PH + (rs / KW) * DH, ix = (p % OW) * SW - PW + (rs % KW) * DW;
  if (iy < 0 || iy >= H || ix < 0 || ix >= W) return 0.f;
  return kiln::cvt<float>(a[((img * C + g * CG + c) * H + iy) * W + ix]);
#elif MODE == 1
  const int img = m / HW, p = m % HW, o = k / RS, rs = k % RS;
  const int ty = p / W + PH - (rs / KW) * DH, tx = p % W + PW - (rs % KW) * DW;
  if (ty < 0 || tx < 0 || ty % SH != 0 || tx % SW != 0 || ty / SH >= OH || tx / SW >= OW) return 0.f;
  return kiln::cvt<float>(a[((img * O + g * OG + o) * OH + ty / SH) * OW + tx / SW]);
#else
  return kiln::cvt<float>(a[((k / OHW) * O + g * OG + m) * OHW + k % OHW]);
#endif
}

__device__ __forceinline__ float load_b(const TB* __restrict__ b, int g, int k, int n) {
  if (n >= GN || k >= GK) return 0.f;
#if MODE == 0
  return kiln::cvt<float>(b[(g * OG + n) * GK + k]);
#elif MODE == 1
  return kiln::cvt<float>(b[((g * OG + k / RS) * CG + n) * RS + k % RS]);
#else
  const int img = k / OHW, p = k % OHW, c = n / RS, rs = n % RS;
  const int iy = (p / OW) * SH - PH + (rs / KW) * DH, ix = (p % OW) * SW - PW + (rs % KW) * DW;
  if (iy < 0 || iy >= H || ix < 0 || ix >= W) return 0.f;
  return kiln::cvt<float>(b[((img * C + g * CG + c) * H + iy) * W + ix]);
#endif
}

// Output index of C[m][n] for group g.
__device__ __forceinline__ int out_index(int g, int m, int n) {
#if MODE == 0
  return ((m / OHW) * O + g * OG + n) * OHW + m % OHW;
#elif MODE == 1
  return ((m / HW) * C + g * CG + n) * HW + m % HW;
#else
  return (g * OG + m) * GN + n;
#endif
}

// The block's finished tile Cs[n * CLD + m] (f32) into `out`; with SPLITK > 1 each block
// parks its tile in `ws` and the last of a tile's splits sums them in split order
// (deterministic, no float atomics) and resets the tile's counter for the next launch.
__device__ __forceinline__ void finish_tile(float* Cs, TO* __restrict__ out, float* __restrict__ ws, int g, int split,
                                            int m0, int n0, int tid) {
  if (SPLITK > 1) {
    const int tile = (g * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    float* part = ws + (static_cast<long long>(split) * gridDim.x * gridDim.y * G + tile) * (BM * BN);
    for (int idx = tid; idx < BM * BN; idx += THREADS) part[idx] = Cs[(idx / BM) * CLD + idx % BM];
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(&kiln_conv_tiles[tile], 1u) == SPLITK - 1;
    __syncthreads();
    if (!last) return;
    for (int idx = tid; idx < BM * BN; idx += THREADS) {
      float s = 0.f;
      for (int k = 0; k < SPLITK; ++k)  // split order: bit-identical across runs
        s += __ldcg(ws + (static_cast<long long>(k) * gridDim.x * gridDim.y * G + tile) * (BM * BN) + idx);
      Cs[(idx / BM) * CLD + idx % BM] = s;
    }
    if (tid == 0) kiln_conv_tiles[tile] = 0;
    __syncthreads();
  }

  for (int idx = tid; idx < BM * BN; idx += THREADS) {
    int m, n;
    if (MODE == 2) { n = idx % BN; m = idx / BN; } else { m = idx % BM; n = idx / BM; }
    if (m0 + m >= GM || n0 + n >= GN) continue;
    kiln::store(out + out_index(g, m0 + m, n0 + n), Cs[n * CLD + m]);
  }
}
