// Column sums of a split's f32 rows (pasted where a kernel sums them): column i of ws (rows x
// total, row-major) summed over its rows in one fixed order, so every kernel that sums a split
// this way makes the same bits. Each warp of the block sums a run of the rows, 16 loads in
// flight (the rows are read from L2 one after another otherwise), then the warps' sums are
// added in warp order. Every thread of the block calls it with its lane's column; warp 0 gets
// the sums.
template <int THREADS>
__device__ __forceinline__ float kiln_column_sum(const float* __restrict__ ws, long long total, int rows, long long i) {
  constexpr int SEGMENTS = THREADS / 32, BATCH = 16;
  __shared__ float seg_sums[SEGMENTS][32];
  const int lane = threadIdx.x % 32, seg = threadIdx.x / 32;
  const int per = (rows + SEGMENTS - 1) / SEGMENTS, b0 = seg * per, b1 = min(rows, b0 + per);
  float v = 0.f;
  if (i < total)
    for (int b = b0; b < b1; b += BATCH) {
      float part[BATCH];
#pragma unroll
      for (int j = 0; j < BATCH; ++j) part[j] = b + j < b1 ? ws[static_cast<long long>(b + j) * total + i] : 0.f;
#pragma unroll
      for (int j = 0; j < BATCH; ++j)
        if (b + j < b1) v += part[j];
    }
  seg_sums[seg][lane] = v;
  __syncthreads();
  float s = seg_sums[0][lane];
  for (int k = 1; k < SEGMENTS; ++k) s += seg_sums[k][lane];
  return s;
}
