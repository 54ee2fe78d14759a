#pragma once
// Mixed precision (PyTorch's torch.autocast): inside an AutocastGuard scope matmul, linear and
// conv2d cast their f32 inputs to bf16 or f16 (the GEMMs accumulate in f32), and softmax,
// log_softmax, nll_loss, cross_entropy and mse_loss cast f16/bf16 inputs to f32. The casts are
// ordinary differentiable ops, so f32 master weights get f32 gradients.
//   Tensor loss;
//   { AutocastGuard amp(DType::bf16); loss = cross_entropy(net(x), y); }  // loss is f32
//   loss.backward();
// The scope is per thread and nests; backward() runs with autocast off, so each gradient has
// the dtype its forward op chose. f64 inputs are never cast.
#include <optional>

#include "tensor.h"

namespace kiln {

// This thread's autocast dtype (f16 or bf16); nullopt outside any scope or inside a disabled one.
std::optional<DType> autocast_dtype();

class AutocastGuard {
 public:
  // dtype f16 or bf16 turns autocast on for the scope, nullopt turns it off; DTypeError otherwise.
  explicit AutocastGuard(std::optional<DType> dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  std::optional<DType> prev_;
};

// For the entry points of ops that run in the autocast dtype: an f32 t cast to it while
// autocast is on; otherwise (and for undefined t) t itself.
Tensor autocast_lower(const Tensor& t);
// For the entry points of ops that compute in f32: an f16/bf16 t cast to f32 while autocast is
// on; otherwise t itself.
Tensor autocast_f32(const Tensor& t);

}  // namespace kiln
