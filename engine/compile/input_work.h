#pragma once
// Internal to engine/compile: work on a compiled call's inputs that the input copy at the graph's
// head does beside its copy, so the step launches no kernel of its own for it: casts of an input
// (autocast's of the images) and gathers of a tensor's rows by an input (a batch's rows of a
// dataset held on the device). An eager call notes what its step asks and makes it with the input
// copy's kernel, as the capture after it will; the capture has the copy write it, and the step's
// cast() and index_select() get it.
#include <cstdint>
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

// index_select(source, 0, input): the rows the input names. Taken only while the step writes
// no source it gathers from: its version when the capture gathers is the eager call's.
struct InputGather {
  std::size_t input = 0;
  Tensor source;
  std::uint64_t version = 0;
  Tensor made;
};

struct InputWork {
  std::vector<InputCast> casts;
  std::vector<InputGather> gathers;
  void clear_made();  // the capture's pool goes
};

struct CallInputs;

// The input copy's conversion from `from` to `to`; CopyConvert::none when it has none.
kernels::CopyConvert copy_conversion(DType from, DType to);
// The copy of `work`'s made tensors from this call's inputs, as the input copy's entries.
void add_copies(const InputWork& work, const std::vector<Tensor>& inputs, std::vector<kernels::InputCopies>& copies,
                std::size_t& entries);

// While alive, the thread's compiled call (on a GPU) has these inputs. An eager call's scope
// appends what its step asks of them to `work` and makes each with the input copy's kernel, as
// the capture will; a capture's hands the step the made tensors of `work`, each once.
class InputWorkScope {
 public:
  InputWorkScope(const std::vector<Tensor>& inputs, InputWork& work, bool capture);
  ~InputWorkScope();
  InputWorkScope(const InputWorkScope&) = delete;
  InputWorkScope& operator=(const InputWorkScope&) = delete;
  // After the step: an eager call drops the gathers whose source the step wrote (the capture
  // runs those itself). Ends the scope's hooks.
  void finish();

 private:
  std::unique_ptr<CallInputs> call_;
};

// StepCompiler::input_cast and input_gather: the work made as the input copy makes it, or nullopt.
std::optional<Tensor> input_cast(const Tensor& t, DType to);
std::optional<Tensor> input_gather(const Tensor& source, const Tensor& index);

}  // namespace kiln::compile_detail
