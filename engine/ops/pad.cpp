// Constant padding with PyTorch's pad list (last dim first: {lo, hi, lo, hi, ...}): the
// output is filled with the value, then the input is copied into its interior view
// (loops on the CPU, the fill and cast kernels on the GPU). The vjp slices the gradient.
#include "kiln/shape_ops.h"
#include "core/registry.h"
#include "core/tensor/copy.h"

namespace kiln {

namespace {

using Ints = std::vector<std::int64_t>;

// (lo, hi) padding of dim d, or (0, 0) when the list does not reach it.
std::pair<std::int64_t, std::int64_t> pads_of(const Ints& pads, int d, int nd) {
  const std::size_t k = static_cast<std::size_t>(nd - 1 - d) * 2;
  return k + 1 < pads.size() ? std::pair{pads[k], pads[k + 1]} : std::pair{std::int64_t{0}, std::int64_t{0}};
}

std::vector<Shape> pad_shape(const OpArgs& a) {
  const Ints& pads = a.attrs.get<Ints>("pads");
  const Shape& in = a.inputs[0].shape();
  if (pads.size() % 2 != 0 || pads.size() > 2 * in.size())
    throw ShapeError("[pad] pads " + shape_str(pads) + " need an even length of at most twice the dims of shape " +
                     shape_str(in));
  for (std::int64_t p : pads)
    if (p < 0) throw ValueError("[pad] pads " + shape_str(pads) + " must not be negative");
  Shape out = in;
  for (int d = 0; d < static_cast<int>(in.size()); ++d) {
    auto [lo, hi] = pads_of(pads, d, static_cast<int>(in.size()));
    out[static_cast<std::size_t>(d)] += lo + hi;
  }
  return {out};
}

void pad_impl(const OpArgs& a, std::span<Tensor> out) {
  const Tensor& o = out[0];
  const Ints& pads = a.attrs.get<Ints>("pads");
  check_fits(a.attrs.get<Scalar>("value"), o.dtype(), "pad");
  fill_into(o, a.attrs.get<Scalar>("value"));
  std::int64_t offset = o.offset();
  for (int d = 0; d < o.dim(); ++d)
    offset += pads_of(pads, d, o.dim()).first * o.strides()[static_cast<std::size_t>(d)];
  if (a.inputs[0].numel() > 0) copy_into(a.inputs[0], make_view(o, a.inputs[0].shape(), o.strides(), offset));
}

const OpDef& kPad = register_op({
    .name = "pad",
    .dtype_rule = rules::same_as_input,
    .shape_rule = pad_shape,
    .cpu = pad_impl,
    .gpu = pad_impl,
    .vjp = [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
      const Ints& pads = c.attrs().get<Ints>("pads");
      const Shape& in = c.input(0).shape;
      Tensor r = g[0];
      for (int d = 0; d < static_cast<int>(in.size()); ++d) {
        const std::int64_t lo = pads_of(pads, d, static_cast<int>(in.size())).first;
        if (r.shape()[static_cast<std::size_t>(d)] != in[static_cast<std::size_t>(d)])
          r = narrow(r, d, lo, in[static_cast<std::size_t>(d)]);
      }
      return {r};
    },
    .test = {.attrs = {Attrs{{"pads", Ints{1, 2}}, {"value", Scalar(0.0)}},
                       Attrs{{"pads", Ints{0, 1, 2, 0}}, {"value", Scalar(-1.5)}}}},
});

}  // namespace

Tensor pad(const Tensor& a, const std::vector<std::int64_t>& pads, const Scalar& value) {
  return call(kPad, {a}, Attrs{{"pads", pads}, {"value", value}});
}

}  // namespace kiln
