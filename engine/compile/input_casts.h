#pragma once
// Internal to engine/compile: casts of a compiled call's inputs (autocast's of the images, say)
// that the input copy at the graph's head writes beside its copy, so the step launches no cast
// kernel for them. An eager call notes the casts its step asks of its inputs; the capture after
// it has the copy write them, and the step's cast() gets them.
#include <memory>
#include <optional>
#include <vector>

#include "backend/cuda/generated/step_io/step_io_kernels.h"
#include "kiln/tensor.h"

namespace kiln::compile_detail {

struct InputCast {
  std::size_t input = 0;
  DType dtype = DType::f32;
  Tensor made;  // a capture's: what the input copy writes
};

struct CallInputs;

// The input copy's conversion from `from` to `to`; CopyConvert::none when it has none.
kernels::CopyConvert copy_conversion(DType from, DType to);

// While alive, the thread's compiled call (on a GPU) has these inputs. An eager call's scope
// appends the casts its step asks of them to `casts` and makes each with the input copy's
// kernel, as the capture will; a capture's hands the step the `made` tensors of `casts`, each
// once.
class InputCastScope {
 public:
  InputCastScope(const std::vector<Tensor>& inputs, std::vector<InputCast>& casts, bool capture);
  ~InputCastScope();
  InputCastScope(const InputCastScope&) = delete;
  InputCastScope& operator=(const InputCastScope&) = delete;

 private:
  std::unique_ptr<CallInputs> call_;
};

// StepCompiler::input_cast: a cast of an input made as the input copy makes it, or nullopt.
std::optional<Tensor> input_cast(const Tensor& t, DType to);

}  // namespace kiln::compile_detail
