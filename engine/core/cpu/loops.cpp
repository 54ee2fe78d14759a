#include "loops.h"

namespace kiln::cpu {

Shape broadcast_strides(const Shape& in_shape, const Shape& in_strides, const Shape& out_shape) {
  if (in_shape.size() > out_shape.size())
    throw ShapeError("[broadcast] shape " + shape_str(in_shape) + " has more dims than " + shape_str(out_shape));
  const std::size_t lead = out_shape.size() - in_shape.size();
  Shape s(out_shape.size(), 0);
  for (std::size_t i = 0; i < in_shape.size(); ++i) {
    const std::int64_t d = in_shape[i], o = out_shape[lead + i];
    if (d == o) s[lead + i] = in_strides[i];
    else if (d != 1) throw ShapeError("[broadcast] shape " + shape_str(in_shape) + " does not broadcast to " + shape_str(out_shape));
  }
  return s;
}

}  // namespace kiln::cpu
