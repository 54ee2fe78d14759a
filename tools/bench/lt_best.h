#pragma once
// cuBLASLt's best algorithm for one product, the reference bench_gemm holds kiln against: every
// algorithm its heuristic offers (up to `max_algos`, not only the first few), each timed.
#include <cstdint>
#include <string>

#include "kiln/runtime/device.h"

namespace kiln::bench {

enum class LtPrecision { f32, tf32, bf16 };
enum class LtEpilogue { none, bias, bgrad_b };

// Column-major, as cuBLASLt sees it: D (m x n) = op(A) (m x k) @ op(B) (k x n) [+ bias (m)], or
// with bgrad_b the sums of op(B) over k written to `bias` (n values).
struct LtProduct {
  std::int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  std::int64_t lda = 0, ldb = 0, ldd = 0;
  LtEpilogue epilogue = LtEpilogue::none;
  const void *a = nullptr, *b = nullptr;
  void *d = nullptr, *bias = nullptr;
};

struct LtBest {
  double us = -1;     // the fastest algorithm's median microseconds per call; -1 when none ran
  int algos = 0;      // algorithms the heuristic offered and that ran
  std::string error;  // why none ran
};

// Times every algorithm (median of `reps` batches of `calls`) on `stream` with a 32 MiB workspace.
LtBest lt_best(const LtProduct& p, LtPrecision precision, const rt::Stream& stream, int max_algos, int reps,
               int calls);

}  // namespace kiln::bench
