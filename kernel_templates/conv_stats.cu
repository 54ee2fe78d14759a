// A conv's output statistics for the batch norm that reads it next, pasted (CONV_STATS) into
// the kinds that take them (conv_direct.cu, conv_patch.cu) on a grid of blocks along x: each
// block parks its channels' sums and squares of the values it stored as a row of `parts`
// (blocks, 2 * channels) in f32; the last block of each group of kStatsGroup adds its group's
// rows in f64 after them, and the last group's adds the groups' sums into totals (2, channels):
// two short merges, not one long one. The counters go back to 0 for the next launch or replay.
constexpr int kStatsGroup = 16, kMaxStatsGroups = 4096;
__device__ unsigned int kiln_conv_stats_groups[kMaxStatsGroups];
__device__ unsigned int kiln_conv_stats_done;

// After this block parked its row: the merges (every thread of the block calls it; `scratch`
// holds blockDim.x doubles of shared memory that nothing else still reads).
__device__ void merge_conv_stats(float* parts, long long columns, double* totals, double* scratch) {
  const unsigned g = blockIdx.x / kStatsGroup, groups = (gridDim.x + kStatsGroup - 1) / kStatsGroup;
  const unsigned members = gridDim.x - g * kStatsGroup < kStatsGroup ? gridDim.x - g * kStatsGroup : kStatsGroup;
  double* group_sums = reinterpret_cast<double*>(parts + (columns * gridDim.x + 1) / 2 * 2);
  const int t = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
  auto sync = [] { __syncthreads(); };
  if (!kiln::block::last_of(&kiln_conv_stats_groups[g], members)) return;
  kiln::block::sum_columns(parts + static_cast<long long>(g) * kStatsGroup * columns, members, columns, columns,
                           group_sums + static_cast<long long>(g) * columns, scratch, t, threads, sync);
  if (!kiln::block::last_of(&kiln_conv_stats_done, groups)) return;
  kiln::block::sum_columns(group_sums, groups, columns, columns, totals, scratch, t, threads, sync);
}
