#pragma once
// How the dispatcher hands op calls to autograd.
#include <span>

#include "kiln/attrs.h"
#include "kiln/autograd.h"
#include "kiln/tensor.h"

namespace kiln {

bool any_requires_grad(std::span<const Tensor> inputs);

// Records a node for one call: edges to the inputs' producers or leaves, the save
// policy's tensors (cast inputs / outputs, as history-free aliases), and metadata.
// Floating outputs get the node as their grad_fn.
void record_node(const OpDef& op, const Attrs& attrs, std::span<const Tensor> inputs,
                 std::span<const Tensor> cast_inputs, std::span<Tensor> outputs);

// After an in-place update wrote `result` into `self`: self now carries result's history.
void rebase_history(const Tensor& self, const Tensor& result);

}  // namespace kiln
