// In-place writes through views, as PyTorch's CopySlices: the write becomes part of the
// base's history (a scatter of the new values into the old base), and the view is
// re-derived from the new base. Views whose base was rewritten later catch up lazily.
#include <algorithm>
#include <numeric>

#include "core/registry.h"
#include "record.h"
#include "core/tensor/copy.h"
#include "core/tensor/tensor_impl.h"

namespace kiln {

namespace {

using Ints = std::vector<std::int64_t>;

// Elements of storage a non-overlapping layout spans, from its first element.
std::int64_t span_of(const Shape& shape, const Shape& strides) {
  if (shape_numel(shape) == 0) return 0;
  std::int64_t last = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) last += (shape[d] - 1) * strides[d];
  return last + 1;
}

// No two indices of the layout reach one element (sufficient test: sorted by stride, each
// stride steps past everything the smaller ones cover).
bool overlaps(const Shape& shape, const Shape& strides) {
  std::vector<std::size_t> dims;
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (shape[d] > 1) dims.push_back(d);
  std::sort(dims.begin(), dims.end(), [&](std::size_t a, std::size_t b) { return strides[a] < strides[b]; });
  std::int64_t covered = 0;
  for (std::size_t d : dims) {
    if (strides[d] <= covered) return true;
    covered += (shape[d] - 1) * strides[d];
  }
  return false;
}

// The base's layout and the view's, both relative to the base's first element, as attrs.
Attrs geometry(const TensorImpl& base, const Tensor& view) {
  return Attrs{{"base_shape", Ints(base.shape)},
               {"base_strides", Ints(base.strides)},
               {"shape", Ints(view.shape())},
               {"strides", Ints(view.strides())},
               {"offset", view.offset() - base.offset}};
}

// Zeros spanning the base's storage, and the base's and the view's layouts over them:
// gradients move between the two through this buffer.
struct Scratch {
  Tensor base, view;
};
Scratch scratch(const Attrs& a, const Tensor& like) {
  const Ints& bs = a.get<Ints>("base_shape");
  const Ints& bst = a.get<Ints>("base_strides");
  Tensor flat = filled({span_of(bs, bst)}, 0, like.dtype(), like.device());
  return {make_view(flat, bs, bst, 0), make_view(flat, a.get<Ints>("shape"), a.get<Ints>("strides"),
                                                  a.get<std::int64_t>("offset"))};
}

Impl not_dispatched(const char* name) {
  return [name](const OpArgs&, std::span<Tensor>) {
    throw Error(std::string("[") + name + "] is recorded by autograd only and never dispatched");
  };
}

// view = as_strided(base): the gradient of the view lands in its place within the base.
const OpDef kViewOfBase{
    .name = "view_of_base",
    .cpu = not_dispatched("view_of_base"),
    .vjp = [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
      Scratch s = scratch(c.attrs(), g[0]);
      copy_into(g[0], s.view);
      return {s.base.contiguous()};
    },
};

// new_base = old_base with the view's elements replaced by src.
const OpDef kViewScatter{
    .name = "view_scatter",
    .num_inputs = 2,
    .cpu = not_dispatched("view_scatter"),
    .vjp = [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
      Scratch s = scratch(c.attrs(), g[0]);
      copy_into(g[0], s.base);
      std::vector<Tensor> r(2);
      if (c.needs_grad(1)) r[1] = convert(s.view, s.view.dtype());
      if (c.needs_grad(0)) {
        fill_into(s.view, 0);  // the overwritten elements no longer depend on the old base
        r[0] = s.base.contiguous();
      }
      return r;
    },
};

bool base_requires_grad(const TensorImpl& t) { return t.view_base && t.view_base->requires_grad; }

// A view's history made again from its base's current one.
void rederive(const Tensor& view) {
  TensorImpl& v = *view.impl();
  const std::shared_ptr<TensorImpl>& base = v.view_base;
  v.history_epoch = base->history_epoch;
  if (!base->requires_grad) {
    v.grad_fn.reset();
    v.requires_grad = false;
    return;
  }
  const Tensor b(base);
  Tensor out[] = {view};
  record_node(kViewOfBase, geometry(*base, view), {&b, 1}, {&b, 1}, out);
}

}  // namespace

void mark_views(const Tensor& input, std::span<Tensor> outputs) {
  const std::shared_ptr<TensorImpl>& in = input.impl_ptr();
  const std::shared_ptr<TensorImpl>& base = in->view_base ? in->view_base : in;
  for (Tensor& out : outputs) {
    if (!out.shares_storage(input) || out.is_same(input)) continue;
    out.impl()->view_base = base;
    out.impl()->history_epoch = base->history_epoch;
  }
}

void refresh_view(const Tensor& t) {
  const TensorImpl& v = *t.impl();
  if (v.view_base && v.history_epoch != v.view_base->history_epoch) rederive(t);
}

bool inplace_needs_history(const Tensor& self, std::span<const Tensor> others) {
  if (!grad_enabled()) return false;
  refresh_view(self);
  return self.requires_grad() || base_requires_grad(*self.impl()) || any_requires_grad(others);
}

void check_inplace(const Tensor& self, std::string_view who) {
  const TensorImpl& s = *self.impl();
  const std::string w(who);
  if (self.is_leaf() && self.requires_grad())
    throw ValueError(w + "a leaf tensor that requires grad cannot be modified in place (use NoGradGuard)");
  if (!s.view_base) return;
  const TensorImpl& base = *s.view_base;
  if (!base.grad_fn && base.requires_grad)
    throw ValueError(w + "a view of a leaf tensor that requires grad cannot be modified in place (use NoGradGuard)");
  if (overlaps(self.shape(), self.strides()) || overlaps(base.shape, base.strides))
    throw ValueError(w + "the view " + shape_str(self.shape()) + " with strides " + shape_str(self.strides()) +
                     " has elements that share memory; an in-place write to it cannot be differentiated");
  const std::int64_t offset = self.offset() - base.offset;
  const Shape& st = self.strides();
  if (offset < 0 || std::any_of(st.begin(), st.end(), [](std::int64_t x) { return x < 0; }) ||
      offset + span_of(self.shape(), st) > std::max<std::int64_t>(span_of(base.shape, base.strides), offset))
    throw ValueError(w + "the view lies outside its base; an in-place write to it cannot be differentiated");
}

void rebase_history(const Tensor& self, const Tensor& result) {
  TensorImpl& s = *self.impl();
  if (s.view_base) {
    TensorImpl& base = *s.view_base;
    if (result.requires_grad() || base.requires_grad) {
      const Tensor b(s.view_base);
      const Tensor inputs[] = {b, result};
      Tensor out[] = {b};
      record_node(kViewScatter, geometry(base, self), inputs, inputs, out);
    }
    ++base.history_epoch;
    rederive(self);
    return;
  }
  const TensorImpl& r = *result.impl();
  s.grad_fn = r.grad_fn;
  s.output_nr = r.output_nr;
  s.requires_grad = r.grad_fn != nullptr || r.requires_grad;
  ++s.history_epoch;
}

}  // namespace kiln
