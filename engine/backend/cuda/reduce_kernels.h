#pragma once
// Launchers of the reduction kernels (kernel_templates/reduce.cu). The engine arranges the
// input as a contiguous [outer, r, inner] block and reduces over r; the output is a
// contiguous [outer, inner] block. Specs: sum prod mean max min argmax argmin var std
// logsumexp (reduce_kernels.cpp, with the launchers).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kiln/dtype.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/memory.h"

namespace kiln::rt {
class Stream;
}

namespace kiln::kernels {

inline constexpr unsigned kReduceBlock = 256;          // threads per block, fixed by the template
inline constexpr std::size_t kReduceStateBytes = 32;  // bound on any op's partial state

// How one pass over [outer, r, inner] maps onto the GPU.
struct ReducePlan {
  int lanes = 0;             // inner == 1: lanes per row (1..32), 0 = a block; else lanes across inner
  int lanes_r = 0;           // inner > 1: lanes along r (the rest of a block takes further rows of outer)
  int col_vec = 1;           // inner > 1: adjacent columns each lane reads with one load
  std::int64_t splits = 1;   // chunks r is cut into; > 1 means partial states and a second pass
  std::int64_t chunk = 0;    // elements of r per chunk
  std::uint32_t blocks = 0;  // grid size (the kernel loops when there are more work items)
};

// vec: elements per 16-byte load, or 1 when the pass reads partial states or (for columns)
// the input is not 16-byte aligned; allow_split is false for a second pass, which always
// finishes the reduction.
ReducePlan plan_reduce(std::int64_t outer, std::int64_t r, std::int64_t inner, int vec, int sm_count,
                       bool allow_split = true);

// False for max, min, argmax and argmin: reducing an empty dimension is an error.
bool reduce_has_identity(std::string_view op);

// out[o, i] = op over k of in[o, k, i]. param is the correction of var/std (0 or 1). Empty r:
// sum 0, prod 1, mean/var/std NaN, logsumexp -inf; max/min/argmax/argmin throw ValueError
// before any launch. When r is split, partial states live in a stream-ordered temporary.
void launch_reduce(const rt::KernelSpec& spec, DType in, DType out, rt::DevicePtr in_ptr, rt::DevicePtr out_ptr,
                   std::int64_t outer, std::int64_t r, std::int64_t inner, const rt::Stream& s, double param = 0);

}  // namespace kiln::kernels
