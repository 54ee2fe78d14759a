// What the entry points of matmul, linear, conv2d, softmax and the losses do in an autocast
// scope (kiln/amp.h; the scope's state is in engine/core/amp_state.cpp), and the low-precision
// copies of parameters that spare a forward its weight casts.
#include "kiln/amp.h"

#include "kiln/ops.h"
#include "core/registry.h"
#include "core/step/step_state.h"
#include "core/tensor/copy.h"
#include "core/tensor/dispatch.h"
#include "core/tensor/tensor_impl.h"
#include "kiln/runtime/kernel_plan.h"

namespace kiln {

namespace {

// Writes lp's copy from the parameter's present values.
void rewrite(const Tensor& param, LowPrecisionCopy& lp) {
  copy_into(param, lp.copy);
  lp.written_from(*param.impl());
}

// The parameter's current low-precision copy, as a new handle (no kernel when the optimizer
// kept it current). A captured step refreshes the copy before a replay when the parameter was
// written since by anything but the optimizer (a restore, a load).
void low_precision_weight(const OpArgs& a, std::span<Tensor> out) {
  const Tensor& w = a.inputs[0];
  const DType to = a.attrs.get<DType>("dtype");
  TensorImpl& param = *w.impl();
  std::shared_ptr<LowPrecisionCopy>& lp = param.low_precision;
  if (rt::shape_only()) {  // the cast a first real call makes; a copy it kept would hold nothing
    out[0] = convert(w, to);
    return;
  }
  if (!lp || lp->copy.dtype() != to || !lp->current_for(param)) {
    // Not inside a capture: a new copy would live in the graph's private pool.
    if (step::capturing()) {
      out[0] = convert(w, to);  // a cast node, as without the copy
      return;
    }
    if (!lp || lp->copy.dtype() != to) {
      lp = std::make_shared<LowPrecisionCopy>();
      lp->copy = Tensor(make_impl(w.shape(), to, w.device()));
    }
    rewrite(w, *lp);
  }
  if (step::capturing()) {
    step::keep_alive(lp->copy);
    step::on_replay([weak = std::weak_ptr<TensorImpl>(w.impl_ptr()), copy = lp] {
      const std::shared_ptr<TensorImpl> p = weak.lock();
      if (p && !copy->current_for(*p)) rewrite(Tensor(p), *copy);
    });
  }
  out[0] = make_view(lp->copy, lp->copy.shape(), lp->copy.strides(), 0);
}

// The gradient reaches the parameter in f32: a weight-gradient product gives it in f32 where it
// can (VjpContext::grad_dtype), else the engine converts it, so the vjp is the identity.

const OpRef kAutocastWeight = register_op({
    .name = "autocast_weight",
    .dtypes = {DType::f32},
    .dtype_rule =
        [](const OpArgs& a) {
          return DTypePlan{{DType::f32}, {a.attrs.get<DType>("dtype")}, DType::f32};
        },
    .shape_rule = rules::same_shape_as_input,
    .cpu = [](const OpArgs& a, std::span<Tensor> out) { out[0] = convert(a.inputs[0], a.attrs.get<DType>("dtype")); },
    .gpu = low_precision_weight,
    .makes_outputs = true,
    .vjp = rules::pass_through,
    .gradient_in_input_dtype = true,
    .test = {.attrs = {Attrs{{"dtype", DType::bf16}}, Attrs{{"dtype", DType::f16}}}, .gradcheck = false},
});

// A parameter (a contiguous leaf that requires grad) on the GPU: its casts go through its copy.
bool is_parameter(const Tensor& t) {
  return t.device().is_cuda() && t.is_leaf() && t.requires_grad() && t.is_contiguous() && t.offset() == 0 &&
         !t.impl()->view_base;
}

}  // namespace

Tensor autocast_lower(const Tensor& t) {
  const std::optional<DType> to = autocast_dtype();
  if (!to || !t.defined() || t.dtype() != DType::f32) return t;
  if (is_parameter(t)) return call(kAutocastWeight, {t}, Attrs{{"dtype", *to}});
  return cast(t, *to);
}

Tensor autocast_f32(const Tensor& t) {
  if (!autocast_dtype() || !t.defined() || (t.dtype() != DType::f16 && t.dtype() != DType::bf16)) return t;
  return cast(t, DType::f32);
}

}  // namespace kiln
