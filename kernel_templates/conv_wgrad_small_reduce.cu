// The small weight-gradient kinds' second kernel (pasted by conv_wgrad_small.cu and
// conv_wgrad_small_mma.cu after THREADS, TOTAL and TD): dw[i] = sum over blocks b of
// ws[b][i], where each block of the first kernel stored its row whole. A block takes 32 weights,
// a lane each, and its warps a run of the rows each, in order, 16 loads in flight (the rows are
// read from L2 one after another otherwise); then the warps' sums are added in warp order.
extern "C" __global__ void __launch_bounds__(THREADS)
    kiln_conv_wgrad_small_reduce(const float* __restrict__ ws, TD* __restrict__ dw, int BLOCKS) {
  kiln::wait_prior_grids();
  constexpr int SEGMENTS = THREADS / 32, BATCH = 16;
  __shared__ float seg_sums[SEGMENTS][32];
  const int lane = threadIdx.x % 32, seg = threadIdx.x / 32, i = blockIdx.x * 32 + lane;
  const int per = (BLOCKS + SEGMENTS - 1) / SEGMENTS, b0 = seg * per, b1 = min(BLOCKS, b0 + per);
  float v = 0.f;
  if (i < TOTAL)
    for (int b = b0; b < b1; b += BATCH) {
      float part[BATCH];
#pragma unroll
      for (int j = 0; j < BATCH; ++j) part[j] = b + j < b1 ? ws[static_cast<long long>(b + j) * TOTAL + i] : 0.f;
#pragma unroll
      for (int j = 0; j < BATCH; ++j)
        if (b + j < b1) v += part[j];
    }
  seg_sums[seg][lane] = v;
  __syncthreads();
  if (seg == 0 && i < TOTAL) {
    float s = seg_sums[0][lane];
    for (int k = 1; k < SEGMENTS; ++k) s += seg_sums[k][lane];
    dw[i] = kiln::cvt<TD>(s);
  }
}
