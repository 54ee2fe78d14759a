#include "sum_to.h"

#include <cstdint>
#include <vector>

#include "kiln/error.h"
#include "kiln/ops.h"

namespace kiln {

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  const Shape& g = grad.shape();
  if (g == shape) return grad;
  if (shape.size() > g.size()) throw ShapeError("[sum_to] cannot reduce " + shape_str(g) + " to " + shape_str(shape));
  const std::size_t lead = g.size() - shape.size();
  std::vector<std::int64_t> axes;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (i < lead) {
      axes.push_back(static_cast<std::int64_t>(i));
    } else if (shape[i - lead] != g[i]) {
      if (shape[i - lead] != 1) throw ShapeError("[sum_to] cannot reduce " + shape_str(g) + " to " + shape_str(shape));
      axes.push_back(static_cast<std::int64_t>(i));
    }
  }
  Tensor s = sum(grad, axes, /*keepdim=*/true);
  return lead == 0 ? s : reshape(s, shape);
}

}  // namespace kiln
