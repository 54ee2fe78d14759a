// Views that rearrange shape and strides over the same storage: permute, squeeze,
// unsqueeze and slice (with steps), plus slice_backward, which scatters a slice's gradient
// into zeros of the input's shape. transpose, expand, flatten, narrow and contiguous are
// thin wrappers over these and reshape/broadcast_to.
#include <algorithm>

#include "kiln/shape_ops.h"
#include "core/registry.h"
#include "core/tensor/copy.h"

namespace kiln {

namespace {

struct Layout {
  Shape shape, strides;
  std::int64_t offset = 0;
};

using Ints = std::vector<std::int64_t>;

Layout permuted(const Tensor& in, const Ints& dims, std::string_view op) {
  const int nd = in.dim();
  if (static_cast<int>(dims.size()) != nd)
    throw ShapeError("[" + std::string(op) + "] dims " + shape_str(dims) + " do not match a tensor of shape " +
                     shape_str(in.shape()));
  std::vector<bool> seen(static_cast<std::size_t>(nd), false);
  Layout l{{}, {}, in.offset()};
  for (std::int64_t d : dims) {
    const int a = normalize_axis(d, nd, op);
    if (seen[a])
      throw ShapeError("[" + std::string(op) + "] dims " + shape_str(dims) + " repeat dim " + std::to_string(a));
    seen[a] = true;
    l.shape.push_back(in.shape()[a]);
    l.strides.push_back(in.strides()[a]);
  }
  return l;
}

// Drops the listed dims of size 1 (every size-1 dim when "axes" is absent).
Layout squeezed(const Tensor& in, const Attrs& attrs) {
  std::vector<bool> drop(static_cast<std::size_t>(in.dim()), !attrs.has("axes"));
  if (attrs.has("axes"))
    for (int a : normalize_axes(attrs.get<Ints>("axes"), in.dim(), "squeeze")) drop[a] = true;
  Layout l{{}, {}, in.offset()};
  for (int d = 0; d < in.dim(); ++d) {
    if (drop[d] && in.shape()[d] == 1) continue;
    l.shape.push_back(in.shape()[d]);
    l.strides.push_back(in.strides()[d]);
  }
  return l;
}

Layout unsqueezed(const Tensor& in, std::int64_t axis) {
  const int a = normalize_axis(axis, in.dim() + 1, "unsqueeze");
  Layout l{in.shape(), in.strides(), in.offset()};
  // Any stride is valid for a size-1 dim; this one keeps a contiguous input contiguous.
  const std::int64_t stride = a < in.dim() ? in.shape()[a] * in.strides()[a] : 1;
  l.shape.insert(l.shape.begin() + a, 1);
  l.strides.insert(l.strides.begin() + a, stride);
  return l;
}

struct Range {
  std::int64_t start, length, step;
};

// Python's slice.indices for step > 0.
Range slice_range(std::int64_t n, std::int64_t start, std::int64_t stop, std::int64_t step, std::string_view op) {
  if (step <= 0) throw ValueError("[" + std::string(op) + "] step must be positive, got " + std::to_string(step));
  auto clamp = [n](std::int64_t v) { return std::clamp(v < 0 ? v + n : v, std::int64_t{0}, n); };
  const std::int64_t b = clamp(start), e = clamp(stop);
  return {b, e > b ? (e - b + step - 1) / step : 0, step};
}

Attrs slice_attrs(const Attrs& a) {
  return Attrs{{"axis", a.get<std::int64_t>("axis")},
               {"start", a.get<std::int64_t>("start")},
               {"stop", a.get<std::int64_t>("stop")},
               {"step", a.get<std::int64_t>("step")}};
}

Layout sliced(const Shape& shape, const Shape& strides, std::int64_t offset, const Attrs& attrs, std::string_view op) {
  if (shape.empty()) throw ShapeError("[" + std::string(op) + "] cannot slice a zero-dim tensor");
  const int a = normalize_axis(attrs.get<std::int64_t>("axis"), static_cast<int>(shape.size()), op);
  const Range r = slice_range(shape[a], attrs.get<std::int64_t>("start"), attrs.get<std::int64_t>("stop"),
                              attrs.get<std::int64_t>("step"), op);
  Layout l{shape, strides, offset};
  l.shape[a] = r.length;
  l.strides[a] = strides[a] * r.step;
  if (r.length > 0) l.offset += r.start * strides[a];
  return l;
}

Layout sliced(const Tensor& in, const Attrs& attrs) {
  return sliced(in.shape(), in.strides(), in.offset(), attrs, "slice");
}

Ints inverse(const Ints& dims, int nd) {
  Ints inv(dims.size());
  for (std::size_t i = 0; i < dims.size(); ++i)
    inv[static_cast<std::size_t>(normalize_axis(dims[i], nd, "permute"))] = static_cast<std::int64_t>(i);
  return inv;
}

// A view op from a function computing its layout.
template <class F>
OpDef view_op(std::string name, F layout, Vjp vjp, TestHints test) {
  Impl impl = [layout](const OpArgs& a, std::span<Tensor> out) {
    Layout l = layout(a);
    out[0] = make_view(a.inputs[0], l.shape, l.strides, l.offset);
  };
  return OpDef{.name = std::move(name),
               .dtype_rule = rules::same_as_input,
               .shape_rule = [layout](const OpArgs& a) { return std::vector<Shape>{layout(a).shape}; },
               .cpu = impl,
               .gpu = impl,
               .makes_outputs = true,
               .vjp = std::move(vjp),
               .test = std::move(test)};
}

std::vector<Tensor> reshape_to_input(const VjpContext& c, std::span<const Tensor> g) {
  return {reshape(g[0], c.input(0).shape)};
}

const OpDef& kPermute = register_op(view_op(
    "permute", [](const OpArgs& a) { return permuted(a.inputs[0], a.attrs.get<Ints>("dims"), "permute"); },
    [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
      const Ints& dims = c.attrs().get<Ints>("dims");
      return {permute(g[0], inverse(dims, static_cast<int>(dims.size())))};
    },
    {.attrs = {Attrs{{"dims", Ints{1, 0}}}, Attrs{{"dims", Ints{2, 0, 1}}}, Attrs{{"dims", Ints{3, 0, 2, 1}}}}}));

const OpDef& kSqueeze = register_op(view_op("squeeze", [](const OpArgs& a) { return squeezed(a.inputs[0], a.attrs); },
                                            reshape_to_input, {.attrs = {Attrs{}, Attrs{{"axes", Ints{0}}}}}));

const OpDef& kUnsqueeze = register_op(
    view_op("unsqueeze", [](const OpArgs& a) { return unsqueezed(a.inputs[0], a.attrs.get<std::int64_t>("axis")); },
            reshape_to_input, {.attrs = {Attrs{{"axis", std::int64_t{0}}}, Attrs{{"axis", std::int64_t{-1}}}}}));

const OpDef& kSliceBackward = register_op({
    .name = "slice_backward",
    .dtype_rule = rules::same_as_input,
    .shape_rule =
        [](const OpArgs& a) {
          const Shape& full = a.attrs.get<Ints>("shape");
          const Shape want = sliced(full, contiguous_strides(full), 0, a.attrs, a.op.name).shape;
          if (a.inputs[0].shape() != want)
            throw ShapeError("[slice_backward] gradient of shape " + shape_str(a.inputs[0].shape()) +
                             " does not match the slice shape " + shape_str(want) + " of " + shape_str(full));
          return std::vector<Shape>{full};
        },
    .cpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          fill_into(out[0], 0);
          const Layout l = sliced(out[0], a.attrs);
          copy_into(a.inputs[0], make_view(out[0], l.shape, l.strides, l.offset));
        },
    .gpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          fill_into(out[0], 0);
          const Layout l = sliced(out[0], a.attrs);
          copy_into(a.inputs[0], make_view(out[0], l.shape, l.strides, l.offset));
        },
    .vjp = [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
      const Attrs& s = c.attrs();
      return {slice(g[0], s.get<std::int64_t>("axis"), s.get<std::int64_t>("start"), s.get<std::int64_t>("stop"),
                    s.get<std::int64_t>("step"))};
    },
    // Its input has the slice's shape: elements 1 and 3 of 4.
    .test = {.attrs = {Attrs{{"shape", Ints{4}},
                             {"axis", std::int64_t{0}},
                             {"start", std::int64_t{1}},
                             {"stop", kEnd},
                             {"step", std::int64_t{2}}}},
             .gradcheck = false,
             .shapes = {{{2}}}},
});

const OpDef& kSlice = register_op(view_op(
    "slice", [](const OpArgs& a) { return sliced(a.inputs[0], a.attrs); },
    [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
      Attrs attrs = slice_attrs(c.attrs());
      attrs.set("shape", Ints(c.input(0).shape));
      return {call(kSliceBackward, {g[0]}, attrs)};
    },
    {.attrs = {Attrs{{"axis", std::int64_t{0}}, {"start", std::int64_t{1}}, {"stop", kEnd}, {"step", std::int64_t{2}}},
               Attrs{{"axis", std::int64_t{-1}},
                     {"start", std::int64_t{-3}},
                     {"stop", std::int64_t{-1}},
                     {"step", std::int64_t{1}}}}}));

}  // namespace

Tensor permute(const Tensor& a, const std::vector<std::int64_t>& dims) {
  return call(kPermute, {a}, Attrs{{"dims", dims}});
}

Tensor transpose(const Tensor& a, std::int64_t dim0, std::int64_t dim1) {
  Ints dims(static_cast<std::size_t>(a.dim()));
  for (std::size_t i = 0; i < dims.size(); ++i) dims[i] = static_cast<std::int64_t>(i);
  std::swap(dims[static_cast<std::size_t>(normalize_axis(dim0, a.dim(), "transpose"))],
            dims[static_cast<std::size_t>(normalize_axis(dim1, a.dim(), "transpose"))]);
  return permute(a, dims);
}

Tensor expand(const Tensor& a, const Shape& shape) {
  if (shape.size() < static_cast<std::size_t>(a.dim()))
    throw ShapeError("[expand] cannot expand shape " + shape_str(a.shape()) + " to " + shape_str(shape));
  Shape target = shape;
  const std::size_t lead = shape.size() - static_cast<std::size_t>(a.dim());
  for (std::size_t i = 0; i < target.size(); ++i) {
    if (target[i] != -1) continue;
    if (i < lead) throw ShapeError("[expand] -1 is not allowed for the new leading dims of " + shape_str(shape));
    target[i] = a.shape()[i - lead];
  }
  return broadcast_to(a, target);
}

Tensor squeeze(const Tensor& a) { return call(kSqueeze, {a}); }
Tensor squeeze(const Tensor& a, std::int64_t dim) { return squeeze(a, Ints{dim}); }
Tensor squeeze(const Tensor& a, const std::vector<std::int64_t>& dims) {
  return call(kSqueeze, {a}, Attrs{{"axes", dims}});
}
Tensor unsqueeze(const Tensor& a, std::int64_t dim) { return call(kUnsqueeze, {a}, Attrs{{"axis", dim}}); }

Tensor flatten(const Tensor& a, std::int64_t start_dim, std::int64_t end_dim) {
  if (a.dim() == 0) return reshape(a, {1});
  const int s = normalize_axis(start_dim, a.dim(), "flatten"), e = normalize_axis(end_dim, a.dim(), "flatten");
  if (s > e)
    throw ShapeError("[flatten] start_dim " + std::to_string(start_dim) + " comes after end_dim " +
                     std::to_string(end_dim) + " for shape " + shape_str(a.shape()));
  Shape shape(a.shape().begin(), a.shape().begin() + s);
  std::int64_t merged = 1;
  for (int d = s; d <= e; ++d) merged *= a.shape()[d];
  shape.push_back(merged);
  shape.insert(shape.end(), a.shape().begin() + e + 1, a.shape().end());
  return reshape(a, shape);
}

Tensor slice(const Tensor& a, std::int64_t dim, std::int64_t start, std::int64_t stop, std::int64_t step) {
  return call(kSlice, {a}, Attrs{{"axis", dim}, {"start", start}, {"stop", stop}, {"step", step}});
}

Tensor slice(const Tensor& a, const std::vector<SliceSpec>& specs) {
  if (specs.size() > static_cast<std::size_t>(a.dim()))
    throw ShapeError("[slice] " + std::to_string(specs.size()) + " slices for a tensor of shape " +
                     shape_str(a.shape()));
  Tensor out = a;
  for (std::size_t d = 0; d < specs.size(); ++d)
    out = slice(out, static_cast<std::int64_t>(d), specs[d].start, specs[d].stop, specs[d].step);
  return out;
}

Tensor narrow(const Tensor& a, std::int64_t dim, std::int64_t start, std::int64_t length) {
  const int d = normalize_axis(dim, a.dim(), "narrow");
  const std::int64_t n = a.shape()[d];
  const std::int64_t b = start < 0 ? start + n : start;
  if (b < 0 || b > n || length < 0 || b + length > n)
    throw ValueError("[narrow] start " + std::to_string(start) + " and length " + std::to_string(length) +
                     " are out of range for dim " + std::to_string(dim) + " of shape " + shape_str(a.shape()));
  return slice(a, d, b, b + length, 1);
}

Tensor contiguous(const Tensor& a) { return a.contiguous(); }

}  // namespace kiln
