// A conv's output statistics for the batch norm that reads it next, pasted (CONV_STATS) into
// the kinds that take them (conv_direct.cu, conv_direct_mma.cu, conv_patch.cu) on a grid of
// blocks along x: each block parks its channels' sums and squares of the values it stored in
// f32 as its column of `parts` (2 * channels, blocks). The batch norm adds up each row in f64
// as it starts (norm.cu), so the conv ends without a merge: two rounds of last-block counters
// at the end of the speedrun's two convs cost its step 8.7 us on the H200.
__device__ __forceinline__ void park_conv_stat(float* parts, int row, float v) {
  parts[static_cast<long long>(row) * gridDim.x + blockIdx.x] = v;
}
