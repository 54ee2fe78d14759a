#pragma once
// What the loss ops (loss.cpp: nll_loss; cross_entropy.cpp: the fused softmax
// cross-entropy) share: the ignore_index attr, the floating-values-and-integer-labels dtype
// rule, and contiguous device copies for kernels that index rows directly.
#include <optional>
#include <string>
#include <vector>

#include "kiln/nn_functional.h"
#include "core/registry.h"

namespace kiln::loss_detail {


struct Ignore {
  bool on = false;
  std::int64_t index = 0;
  bool skips(std::int64_t label) const { return on && label == index; }
};
inline Ignore ignore_of(const Attrs& a) {
  return a.has("ignore_index") ? Ignore{true, a.get<std::int64_t>("ignore_index")} : Ignore{};
}

// Input `f` is floating (its dtype is the key), input `l` holds integer labels (cast to i64);
// every other input and output takes the key dtype.
inline DTypePlan float_and_labels(const OpArgs& a, int f, int l) {
  const DType ft = a.inputs[static_cast<std::size_t>(f)].dtype(), lt = a.inputs[static_cast<std::size_t>(l)].dtype();
  if (!is_floating(ft) || is_floating(lt) || lt == DType::boolean)
    throw DTypeError("[" + a.op.name + "] needs floating values and integer labels; got " +
                     std::string(dtype_name(ft)) + " and " + std::string(dtype_name(lt)));
  DTypePlan p{std::vector<DType>(a.inputs.size(), ft), {ft}, ft};
  p.inputs[static_cast<std::size_t>(l)] = DType::i64;
  return p;
}

// cross_entropy through the fused op of cross_entropy.cpp: logits (N, C), labels (N), both
// checked by the caller. `f32_loss`: 16-bit logits give an f32 loss, as if cast to f32 first.
Tensor fused_cross_entropy(const Tensor& logits, const Tensor& labels, Reduction reduction, double label_smoothing,
                           std::optional<std::int64_t> ignore_index, bool f32_loss = false);

}  // namespace kiln::loss_detail
