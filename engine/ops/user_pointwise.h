#pragma once
// Engine-internal view of the user pointwise ops (kiln/pointwise.h).
#include "core/registry.h"

namespace kiln {

// True for an op registered by kiln::pointwise, its gradients included. Their host
// reference is the expression evaluator, not tests/support/elementwise_reference.h.
bool is_user_pointwise(const OpDef& op);

}  // namespace kiln
