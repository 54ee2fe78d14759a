#pragma once
// How the dispatcher hands op calls to autograd.
#include <span>
#include <string_view>

#include "kiln/attrs.h"
#include "kiln/autograd.h"
#include "kiln/tensor.h"
#include "core/tensor/dispatch.h"  // the in-place history hooks the tensor layer calls

namespace kiln {

bool any_requires_grad(std::span<const Tensor> inputs);

// Records a node for one call: edges to the inputs' producers or leaves, the save
// policy's tensors (cast inputs / outputs, as history-free aliases), and metadata.
// Floating outputs get the node as their grad_fn.
void record_node(const OpDef& op, const Attrs& attrs, std::span<const Tensor> inputs,
                 std::span<const Tensor> cast_inputs, std::span<Tensor> outputs);

// In-place updates (view_history.cpp).
// Outputs of a view op that alias `input` become views of input's base.
void mark_views(const Tensor& input, std::span<Tensor> outputs);
// A view whose base's history was rewritten since takes its history from the base again.
void refresh_view(const Tensor& t);
// Whether an in-place write into self must be recorded: grad mode is on and self, its
// base or one of `others` requires grad.
bool inplace_needs_history(const Tensor& self, std::span<const Tensor> others);
// Throws (naming `who`, e.g. "[add_] ") before an in-place write autograd cannot follow:
// into a leaf that requires grad or a view of one, or a view whose elements overlap.
void check_inplace(const Tensor& self, std::string_view who);
// After an in-place update wrote `result` into `self`: self carries result's history;
// for a view, its base records the write and the view is derived from the base again.
void rebase_history(const Tensor& self, const Tensor& result);

}  // namespace kiln
