#pragma once
// A pooled batch norm's backward sums (sum dy' and sum dy' * (x - mean), a channel), parked by
// the kernel that writes its gradient: a conv2d whose input gradient is the batch norm's whole
// pooled gradient. The conv's vjp names the batch norm (ForGradient), the input gradient's kernel
// parks the sums beside dx (keep), and the batch norm's backward takes them (take) and runs dx
// alone: no reduction kernel of its own. Off by default (set_enabled).
#include <cstdint>
#include <optional>

#include "kiln/tensor.h"

namespace kiln {
class Node;
}

namespace kiln::bn_pool_sums {

// What the reduction reads besides the gradient: the batch norm's input x (N, C, H, W), its
// parameters (undefined where absent), the saved mean and invstd, and whether a ReLU came first.
struct Consumer {
  Tensor x, weight, bias, mean, invstd;
  bool relu = false;
};

// The consumer `producer` is: a batch_norm_max_pool2d in training with 2 x 2 windows whose saved
// tensors are unwritten since; none otherwise (null included). In norm_batch_pool.cpp.
std::optional<Consumer> consumer_of(const Node* producer);

// While one lives on this thread, the input gradient computed under it is `consumer`'s gradient.
class ForGradient {
 public:
  explicit ForGradient(Consumer consumer);
  ~ForGradient();
  ForGradient(const ForGradient&) = delete;
  ForGradient& operator=(const ForGradient&) = delete;
};

// The innermost ForGradient's consumer when `gradient` has its pooled shape (its x's N and C,
// half its H and W, rounded down) and dtype on its device; else null.
const Consumer* wanted(const Tensor& gradient);
// Keeps the sums parked beside `gradient` for the wanted consumer: parts (2 * C, splits) f32,
// each channel's sum dy' over its splits, then its sum dy' * (x - mean).
void keep(const Tensor& gradient, Tensor parts);
// The parts kept beside exactly g (same storage, place, shape and version) for this consumer's
// tensors, taken; undefined when none are.
Tensor take(const Tensor& g, const Consumer& c);
// Parts taken since the process started (tests).
std::int64_t taken_count();
// Off, no sums are wanted: every pooled batch norm runs its own reduction. Off unless
// KILN_POOL_SUMS=on (tests turn it on).
void set_enabled(bool on);
bool enabled();

}  // namespace kiln::bn_pool_sums
