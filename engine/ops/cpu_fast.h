#pragma once
// What the CPU fast paths share: running an f32 fast path on f16/bf16 tensors, as the kernels
// and the references compute them in f32 and round once.
#include <initializer_list>
#include <span>
#include <vector>

#include "core/registry.h"

namespace kiln::cpu_fast {

inline bool is_half(DType t) { return t == DType::f16 || t == DType::bf16; }

// fast(args, outputs) with the inputs at `widen` and every output given as f32 where they are
// f16/bf16 (the inputs widen exactly; the outputs are copied back, rounding once). False when
// none of them is half, or when `fast` declines.
template <class Fast>
bool through_f32(const OpArgs& a, std::span<Tensor> out, std::initializer_list<int> widen, Fast&& fast) {
  std::vector<Tensor> in(a.inputs.begin(), a.inputs.end()), wide(out.begin(), out.end());
  bool any = false;
  NoGradGuard no_grad;
  for (int i : widen)
    if (in[i].defined() && is_half(in[i].dtype())) in[i] = in[i].to(DType::f32), any = true;
  for (Tensor& t : wide)
    if (is_half(t.dtype())) t = empty(t.shape(), {.dtype = DType::f32}), any = true;
  if (!any || !fast(OpArgs{a.op, in, a.attrs, a.device}, std::span<Tensor>(wide))) return false;
  for (std::size_t i = 0; i < out.size(); ++i)
    if (wide[i].dtype() != out[i].dtype()) out[i].copy_(wide[i]);
  return true;
}

}  // namespace kiln::cpu_fast
