#pragma once
// A small thread pool for the CPU fast paths' own loops (im2col, pooling, norms); OpenBLAS
// threads its GEMMs itself. One job runs at a time: a call made while another is running,
// or from inside a job, runs on the calling thread alone.
#include <cstdint>
#include <functional>

namespace kiln::cpu {

// Threads a job may use, the caller included: KILN_CPU_THREADS when set (1 turns the pool
// off), else std::thread::hardware_concurrency().
int num_threads();

// Calls f(begin, end) over disjoint ranges covering [0, n), each at least `grain` items
// (the last may be shorter), spread over num_threads() threads. Returns when all are done;
// the first exception f throws is rethrown here.
void parallel_for(std::int64_t n, std::int64_t grain, const std::function<void(std::int64_t, std::int64_t)>& f);

}  // namespace kiln::cpu
