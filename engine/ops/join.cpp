// cat writes each input into its slice of the output (a strided copy: plain loops on the
// CPU, the cast kernel with in == out dtype on the GPU); its vjp hands each input the
// matching slice of the gradient. stack, split and chunk are built from cat and views.
#include "kiln/shape_ops.h"
#include "core/registry.h"
#include "core/tensor/copy.h"

namespace kiln {

namespace {

int cat_axis(const OpArgs& a) {
  return normalize_axis(a.attrs.get<std::int64_t>("axis"), a.inputs[0].dim(), a.op.name);
}

std::vector<Shape> cat_shape(const OpArgs& a) {
  if (a.inputs.empty()) throw ValueError("[cat] needs at least one tensor");
  const Shape& first = a.inputs[0].shape();
  if (first.empty()) throw ShapeError("[cat] zero-dim tensors cannot be concatenated");
  const int axis = cat_axis(a);
  Shape out = first;
  for (std::size_t i = 1; i < a.inputs.size(); ++i) {
    const Shape& s = a.inputs[i].shape();
    bool ok = s.size() == first.size();
    for (std::size_t d = 0; ok && d < s.size(); ++d) ok = static_cast<int>(d) == axis || s[d] == first[d];
    if (!ok)
      throw ShapeError("[cat] shapes " + shape_str(first) + " and " + shape_str(s) + " (input " + std::to_string(i) +
                       ") differ outside dim " + std::to_string(axis));
    out[axis] += s[axis];
  }
  return {out};
}

// Each input copied into its slice of the output; copy_into picks loops or the kernel.
void cat_impl(const OpArgs& a, std::span<Tensor> out) {
  const int axis = cat_axis(a);
  const Tensor& o = out[0];
  std::int64_t offset = o.offset();
  for (const Tensor& in : a.inputs) {
    if (in.numel() > 0) copy_into(in, make_view(o, in.shape(), o.strides(), offset));
    offset += in.shape()[axis] * o.strides()[axis];
  }
}

const OpDef& kCat = register_op({
    .name = "cat",
    .num_inputs = -1,
    .shape_rule = cat_shape,
    .cpu = cat_impl,
    .gpu = cat_impl,
    .vjp = [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
      const std::int64_t axis = c.attrs().get<std::int64_t>("axis");
      std::vector<Tensor> grads;
      std::int64_t start = 0;
      for (int i = 0; i < c.num_inputs(); ++i) {
        const Shape& s = c.input(i).shape;
        const std::int64_t len = s[static_cast<std::size_t>(normalize_axis(axis, static_cast<int>(s.size()), "cat"))];
        grads.push_back(c.needs_grad(i) ? narrow(g[0], axis, start, len) : Tensor());
        start += len;
      }
      return grads;
    },
    .test = {.attrs = {Attrs{{"axis", std::int64_t{0}}}, Attrs{{"axis", std::int64_t{-1}}}}},
});

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, std::int64_t dim) {
  if (tensors.empty()) throw ValueError("[cat] needs at least one tensor");
  return dispatch(kCat, tensors, Attrs{{"axis", dim}})[0];
}

Tensor stack(const std::vector<Tensor>& tensors, std::int64_t dim) {
  if (tensors.empty()) throw ValueError("[stack] needs at least one tensor");
  for (std::size_t i = 1; i < tensors.size(); ++i)
    if (tensors[i].shape() != tensors[0].shape())
      throw ShapeError("[stack] shapes " + shape_str(tensors[0].shape()) + " and " + shape_str(tensors[i].shape()) +
                       " (input " + std::to_string(i) + ") differ");
  const int axis = normalize_axis(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> parts;
  for (const Tensor& t : tensors) parts.push_back(unsqueeze(t, axis));
  return cat(parts, axis);
}

std::vector<Tensor> split(const Tensor& a, std::int64_t split_size, std::int64_t dim) {
  const int d = normalize_axis(dim, a.dim(), "split");
  if (split_size <= 0) throw ValueError("[split] split_size must be positive, got " + std::to_string(split_size));
  const std::int64_t n = a.shape()[d];
  std::vector<Tensor> out;
  for (std::int64_t s = 0; s < n || (n == 0 && out.empty()); s += split_size)
    out.push_back(narrow(a, d, s, std::min(split_size, n - s)));
  return out;
}

std::vector<Tensor> split(const Tensor& a, const std::vector<std::int64_t>& sizes, std::int64_t dim) {
  const int d = normalize_axis(dim, a.dim(), "split");
  std::int64_t total = 0;
  for (std::int64_t s : sizes) {
    if (s < 0) throw ValueError("[split] sizes " + shape_str(sizes) + " contain a negative size");
    total += s;
  }
  if (total != a.shape()[d])
    throw ShapeError("[split] sizes " + shape_str(sizes) + " do not sum to dim " + std::to_string(dim) + " of shape " +
                     shape_str(a.shape()));
  std::vector<Tensor> out;
  std::int64_t start = 0;
  for (std::int64_t s : sizes) {
    out.push_back(narrow(a, d, start, s));
    start += s;
  }
  return out;
}

std::vector<Tensor> chunk(const Tensor& a, std::int64_t chunks, std::int64_t dim) {
  if (chunks <= 0) throw ValueError("[chunk] chunks must be positive, got " + std::to_string(chunks));
  const int d = normalize_axis(dim, a.dim(), "chunk");
  const std::int64_t n = a.shape()[d];
  return split(a, std::max<std::int64_t>(1, (n + chunks - 1) / chunks), d);
}

}  // namespace kiln
