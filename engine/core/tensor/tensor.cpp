#include "kiln/tensor.h"

#include <cstddef>
#include <string>

#include "copy.h"
#include "core/cpu/loops.h"
#include "dispatch.h"
#include "kiln/autograd.h"
#include "kiln/creation.h"
#include "kiln/ops.h"
#include "tensor_impl.h"

namespace kiln {

namespace {
const TensorImpl& checked(const std::shared_ptr<TensorImpl>& impl) {
  if (!impl) throw ValueError("[tensor] the tensor is undefined");
  return *impl;
}
}  // namespace

Tensor::Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

DType Tensor::dtype() const { return checked(impl_).dtype; }
const Shape& Tensor::shape() const { return checked(impl_).shape; }
const Shape& Tensor::strides() const { return checked(impl_).strides; }
std::int64_t Tensor::offset() const { return checked(impl_).offset; }
int Tensor::dim() const { return static_cast<int>(shape().size()); }
std::int64_t Tensor::numel() const { return shape_numel(shape()); }
std::size_t Tensor::element_size() const { return dtype_size(dtype()); }
Device Tensor::device() const { return checked(impl_).storage->device(); }
void* Tensor::data_ptr() const { return checked(impl_).data(); }

std::int64_t Tensor::size(int axis) const {
  if (dim() == 0) throw ShapeError("[size] a zero-dim tensor has no axis " + std::to_string(axis));
  return shape()[static_cast<std::size_t>(normalize_axis(axis, dim(), "size"))];
}

bool Tensor::is_contiguous() const {
  const TensorImpl& t = checked(impl_);
  std::int64_t expected = 1;
  for (std::size_t i = t.shape.size(); i-- > 0;) {
    if (t.shape[i] == 1) continue;  // any stride is fine for a size-1 dim
    if (t.shape[i] == 0) return true;
    if (t.strides[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

Tensor Tensor::to(Device d) const {
  if (device() == d) return *this;
  step::require_host("to", ("copying a tensor from " + device().str() + " to " + d.str()).c_str());
  return call(get_op("to_device"), {*this}, {{"device", d}});
}


Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone() const {
  static const OpDef& op = get_op("clone");
  return call(op, {*this});
}

Tensor Tensor::detach() const { return make_view(*this, shape(), strides(), offset()); }


bool Tensor::requires_grad() const {
  const TensorImpl& t = checked(impl_);
  return t.requires_grad || t.grad_fn != nullptr;
}

Tensor& Tensor::requires_grad_(bool on) {
  TensorImpl& t = const_cast<TensorImpl&>(checked(impl_));
  if (t.grad_fn) {
    if (!on) throw ValueError("[requires_grad] cannot turn off requires_grad of a non-leaf tensor; use detach()");
    return *this;
  }
  if (on && !is_floating(t.dtype))
    throw DTypeError("[requires_grad] only floating tensors can require grad, not " + std::string(dtype_name(t.dtype)));
  t.requires_grad = on;
  return *this;
}

bool Tensor::is_leaf() const { return checked(impl_).grad_fn == nullptr; }

const Tensor& Tensor::grad() const {
  TensorImpl& t = const_cast<TensorImpl&>(checked(impl_));
  if (t.grad_is_zero) {
    t.grad_is_zero = false;
    fill_into(t.grad, 0);
    bump_version(t.grad);
  }
  return t.grad;
}

void Tensor::set_grad(const Tensor& g) {
  TensorImpl& t = const_cast<TensorImpl&>(checked(impl_));
  if (g.defined() && (g.shape() != t.shape || g.device() != device()))
    throw ShapeError("[grad] a gradient of shape " + shape_str(g.shape()) + " on " + g.device().str() +
                     " does not fit a tensor of shape " + shape_str(t.shape) + " on " + device().str());
  t.grad = g;
  t.grad_is_zero = false;
}

void Tensor::zero_grad() {
  TensorImpl& t = const_cast<TensorImpl&>(checked(impl_));
  // A compiled step keeps each gradient's buffer across steps: the graph writes into it.
  if (step::in_compiled_call() && t.grad.defined()) {
    t.grad_is_zero = true;
    return;
  }
  t.grad = Tensor();
  t.grad_is_zero = false;
}

void Tensor::add_grad_ready_hook(std::function<void(const Tensor& leaf)> hook) {
  TensorImpl& t = const_cast<TensorImpl&>(checked(impl_));
  if (!t.requires_grad || t.grad_fn)
    throw ValueError("[grad] add_grad_ready_hook needs a leaf that requires grad, got " +
                     std::string(t.grad_fn ? "the output of an op" : "a tensor without requires_grad"));
  if (!hook) throw ValueError("[grad] add_grad_ready_hook: the hook is empty");
  t.grad_ready_hooks.push_back(std::move(hook));
}

void Tensor::clear_grad_ready_hooks() { const_cast<TensorImpl&>(checked(impl_)).grad_ready_hooks.clear(); }

std::shared_ptr<Node> Tensor::grad_fn() const { return checked(impl_).grad_fn; }

void Tensor::backward() const { kiln::backward({*this}, {}, false); }
void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  kiln::backward({*this}, {gradient}, retain_graph);
}
void Tensor::backward(const BackwardOptions& o) const { kiln::backward({*this}, {o.gradient}, o.retain_graph); }

// The in-place arithmetic looks its ops up once, not by name on every call.
namespace {
struct InplaceOps {
  const OpDef &add, &sub, &mul, &div, &add_scalar, &sub_scalar, &mul_scalar, &div_scalar;
};
const InplaceOps& inplace_ops() {
  static const InplaceOps ops{get_op("add"),        get_op("sub"),        get_op("mul"),        get_op("div"),
                              get_op("add_scalar"), get_op("sub_scalar"), get_op("mul_scalar"), get_op("div_scalar")};
  return ops;
}
}  // namespace

Tensor& Tensor::add_(const Tensor& o) { return call_inplace(inplace_ops().add, *this, {o}); }
Tensor& Tensor::sub_(const Tensor& o) { return call_inplace(inplace_ops().sub, *this, {o}); }
Tensor& Tensor::mul_(const Tensor& o) { return call_inplace(inplace_ops().mul, *this, {o}); }
Tensor& Tensor::div_(const Tensor& o) { return call_inplace(inplace_ops().div, *this, {o}); }
Tensor& Tensor::add_(const Scalar& s) { return call_inplace(inplace_ops().add_scalar, *this, {}, {{"scalar", s}}); }
Tensor& Tensor::sub_(const Scalar& s) { return call_inplace(inplace_ops().sub_scalar, *this, {}, {{"scalar", s}}); }
Tensor& Tensor::mul_(const Scalar& s) { return call_inplace(inplace_ops().mul_scalar, *this, {}, {{"scalar", s}}); }
Tensor& Tensor::div_(const Scalar& s) { return call_inplace(inplace_ops().div_scalar, *this, {}, {{"scalar", s}}); }

std::uint64_t Tensor::version() const { return checked(impl_).storage->version(); }

bool Tensor::shares_storage(const Tensor& o) const {
  return defined() && o.defined() && impl_->storage == o.impl_->storage;
}

std::string shape_str(const Shape& s) {
  std::string out = "(";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(s[i]);
  }
  if (s.size() == 1) out += ",";
  return out + ")";
}

std::int64_t shape_numel(const Shape& s) {
  std::int64_t n = 1;
  for (std::int64_t d : s) n *= d;
  return n;
}

void check_shape(const Shape& s, std::size_t element_size) {
  // Zero dims are skipped: (0, 2^62, 2^62) holds nothing, but its strides would still overflow.
  std::int64_t span = static_cast<std::int64_t>(element_size);
  for (std::int64_t d : s) {
    if (d < 0) throw ShapeError("[tensor] negative size in shape " + shape_str(s));
    if (d > 0 && __builtin_mul_overflow(span, d, &span))
      throw ShapeError("[tensor] shape " + shape_str(s) + " of " + std::to_string(element_size) +
                       "-byte elements has strides or a size past int64");
  }
}

Shape contiguous_strides(const Shape& s) {
  check_shape(s, 1);
  Shape st(s.size());
  std::int64_t acc = 1;
  for (std::size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= std::max<std::int64_t>(s[i], 1);
  }
  return st;
}

}  // namespace kiln
