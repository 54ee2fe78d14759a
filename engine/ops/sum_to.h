#pragma once
// The backward of broadcasting, for vjps.
#include "kiln/tensor.h"

namespace kiln {

// Sums `grad` down to `shape` (leading dims, and dims where shape has 1): the backward of
// broadcasting `shape` to grad's shape.
Tensor sum_to(const Tensor& grad, const Shape& shape);

}  // namespace kiln
