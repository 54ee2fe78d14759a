// The small weight-gradient kinds' second kernel (pasted by conv_wgrad_small.cu and
// conv_wgrad_small_mma.cu after THREADS, TOTAL and TD, with row_sums.cu before it): dw[i] = sum
// over blocks b of ws[b][i], where each block of the first kernel stored its row whole. A block
// takes 32 weights, a lane each. An optimizer step may make these sums in its own kernel
// instead (optim.cu's SGD and Adam, for a gradient given as a split's rows), in the same order.
extern "C" __global__ void __launch_bounds__(THREADS)
    kiln_conv_wgrad_small_reduce(const float* __restrict__ ws, TD* __restrict__ dw, int BLOCKS) {
  kiln::wait_prior_grids();
  const long long i = blockIdx.x * 32LL + threadIdx.x % 32;
  const float s = kiln_column_sum<THREADS>(ws, TOTAL, BLOCKS, i);
  if (threadIdx.x < 32 && i < TOTAL) dw[i] = kiln::cvt<TD>(s);
}
