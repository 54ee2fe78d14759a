#pragma once
// Launchers of kernel_templates/softmax.cu: softmax/log_softmax over contiguous rows, the
// gather/scatter kernels of nll_loss, the fused softmax cross-entropy and prod's exclusive
// products. Every launcher takes one floating dtype t for its floating operands.
#include <cstdint>

#include "kiln/dtype.h"
#include "kiln/runtime/memory.h"

namespace kiln::rt {
class Stream;
}

namespace kiln::kernels {

// out = softmax (or log_softmax, log_mode) of each of `rows` contiguous rows of `cols`.
void launch_softmax(DType t, rt::DevicePtr in, rt::DevicePtr out, std::int64_t rows, std::int64_t cols, bool log_mode,
                    const rt::Stream& s);

// Log-probabilities (m, classes, inner) and i64 labels (m, inner): loss and valid (1 unless the
// label is ignored), each (m, inner); the backward writes all of grad (-g at the label, else 0).
void launch_nll_forward(DType t, rt::DevicePtr lp, rt::DevicePtr labels, rt::DevicePtr loss, rt::DevicePtr valid,
                        std::int64_t m, std::int64_t classes, std::int64_t inner, std::int64_t ignore, bool has_ignore,
                        const rt::Stream& s);
void launch_nll_backward(DType t, rt::DevicePtr g, rt::DevicePtr labels, rt::DevicePtr grad, std::int64_t total,
                         std::int64_t classes, std::int64_t inner, std::int64_t ignore, bool has_ignore,
                         const rt::Stream& s);

// One launch for any n, even 0 (the last block writes the count and the reduction). reduction:
// 0 none, 1 sum, 2 mean; rows: accumulator scratch of n for sum and mean; stats: n lse, then
// the count. The backward reads stats. `loss`: the loss's dtype (and its gradient g's), t's or,
// for 16-bit logits, f32.
// unit_dx (0: none): dlogits for a loss gradient of 1 (reduction sum, or mean with no label ignored).
void launch_cross_entropy(DType t, DType loss, rt::DevicePtr logits, rt::DevicePtr labels, rt::DevicePtr out,
                          rt::DevicePtr rows, rt::DevicePtr stats, rt::DevicePtr unit_dx, std::int64_t n,
                          std::int64_t classes, int reduction, double smoothing, std::int64_t ignore, bool has_ignore,
                          const rt::Stream& s);
void launch_cross_entropy_backward(DType t, DType loss, rt::DevicePtr g, rt::DevicePtr logits, rt::DevicePtr labels,
                                   rt::DevicePtr stats, rt::DevicePtr dx, std::int64_t n, std::int64_t classes,
                                   int reduction, double smoothing, std::int64_t ignore, bool has_ignore,
                                   const rt::Stream& s);

// out[r, j] = the product of in[r, k] over k != j, a thread per row (prod's gradient).
void launch_exclusive_prod(DType t, rt::DevicePtr in, rt::DevicePtr out, std::int64_t rows, std::int64_t cols,
                           const rt::Stream& s);

}  // namespace kiln::kernels
