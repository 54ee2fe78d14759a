// The small weight-gradient kinds' final sum (pasted by conv_wgrad_small.cu and
// conv_wgrad_small_mma.cu after THREADS, TOTAL, TD and SUM_IN_KERNEL): dw[i] = sum over blocks b
// of ws[b][i], where each block stored its row whole. Every order is fixed, so runs and graph
// replays are bit-identical.
#if SUM_IN_KERNEL
// Few weights: no second kernel. The blocks form up to 16 groups (of 16 rows at 256 blocks); the
// last of a group to finish adds its group's rows in order into a group row (ws past the blocks'
// rows), and the last group to finish adds the group rows in order into dw. Nothing waits, so no
// SM is held while others work; each sum is one block's, so only for few weights.
__device__ unsigned int kiln_wgrad_small_done[17];  // the groups', then the group rows'

namespace wgrad_small_sum {

constexpr int MAX_ROWS = 16, COLUMNS = 4;  // a thread's columns, their rows' loads in flight together

// dst[i] = sum of rows [0, rows) of src (row stride TOTAL) at i, in row order, for every i.
template <class D>
__device__ void sum_rows(const float* src, int rows, D* __restrict__ dst) {
  for (int i0 = threadIdx.x; i0 < TOTAL; i0 += THREADS * COLUMNS) {
    float s[COLUMNS] = {};
    for (int r0 = 0; r0 < rows; r0 += MAX_ROWS) {
      float v[COLUMNS][MAX_ROWS];
#pragma unroll
      for (int c = 0; c < COLUMNS; ++c)
#pragma unroll
        for (int r = 0; r < MAX_ROWS; ++r) {
          const int i = i0 + c * THREADS;
          v[c][r] = r0 + r < rows && i < TOTAL ? __ldcg(src + static_cast<long long>(r0 + r) * TOTAL + i) : 0.f;
        }
#pragma unroll
      for (int c = 0; c < COLUMNS; ++c) {
        if (r0 == 0) s[c] = v[c][0];
#pragma unroll
        for (int r = r0 == 0 ? 1 : 0; r < MAX_ROWS; ++r)
          if (r0 + r < rows) s[c] += v[c][r];
      }
    }
#pragma unroll
    for (int c = 0; c < COLUMNS; ++c)
      if (i0 + c * THREADS < TOTAL) dst[i0 + c * THREADS] = kiln::cvt<D>(s[c]);
  }
}

// Called by every block once its row of ws is stored; ws holds 16 group rows past the blocks'.
__device__ void finish(float* __restrict__ ws, TD* __restrict__ dw) {
  kiln::launch_dependents();
  const int blocks = static_cast<int>(gridDim.x), per = (blocks + MAX_ROWS - 1) / MAX_ROWS;
  const int groups = (blocks + per - 1) / per, g = static_cast<int>(blockIdx.x) / per;
  const int first = g * per, rows = min(per, blocks - first);
  if (!kiln::block::last_of(&kiln_wgrad_small_done[g], static_cast<unsigned>(rows))) return;
  float* group_rows = ws + static_cast<long long>(blocks) * TOTAL;
  sum_rows(ws + static_cast<long long>(first) * TOTAL, rows, group_rows + static_cast<long long>(g) * TOTAL);
  if (!kiln::block::last_of(&kiln_wgrad_small_done[MAX_ROWS], static_cast<unsigned>(groups))) return;
  sum_rows(group_rows, groups, dw);
}

}  // namespace wgrad_small_sum
#else
// Many weights: a second kernel. A block takes 32 weights, a lane each, and its warps a run of
// the rows each, in order, 16 loads in flight (the rows are read from L2 one after another
// otherwise); then the warps' sums are added in warp order.
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
#endif
