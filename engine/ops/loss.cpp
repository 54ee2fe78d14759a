// nll_loss (a registry op: per-element gather with a validity mask, and its scatter
// backward), cross_entropy (the fused op of cross_entropy.cpp for logits (N, C), else
// log_softmax + nll_loss) and mse_loss. GPU: the nll kernels of kernel_templates/softmax.cu.
#include <string>

#include "core/dtype_sets.h"
#include "kiln/amp.h"
#include "kiln/elementwise.h"
#include "kiln/nn_functional.h"
#include "loss_common.h"
#include "core/registry.h"
#include "backend/cuda/softmax_kernels.h"

namespace kiln {

namespace {

using namespace loss_detail;

// Labels (N, d...) against log-probabilities (N, C, d...): C, and the (N, d...) shape.
std::int64_t classes_of(const std::string& op, const Shape& lp, const Shape& labels) {
  Shape expect = lp;
  if (lp.size() >= 2) expect.erase(expect.begin() + 1);
  if (lp.size() < 2 || expect != labels)
    throw ShapeError("[" + op + "] log-probabilities " + shape_str(lp) +
                     " need (N, C, d...) and labels (N, d...); got labels " + shape_str(labels));
  return lp[1];
}

// Strides of the (N, C, d...) tensor without its class dim, so they walk the labels' shape.
Shape without_class_dim(const Shape& s) {
  Shape r = s;
  r.erase(r.begin() + 1);
  return r;
}

std::int64_t inner_of(const Shape& labels) {
  std::int64_t inner = 1;
  for (std::size_t d = 1; d < labels.size(); ++d) inner *= labels[d];
  return inner;
}

const OpRef kNllBackward = register_op({
    .name = "nll_loss_backward",
    .num_inputs = 2,
    .dtypes = dtype_sets::floating,
    .dtype_rule = [](const OpArgs& a) { return float_and_labels(a, 0, 1); },
    .shape_rule =
        [](const OpArgs& a) {
          Shape s = a.inputs[1].shape();
          if (a.inputs[0].shape() != s || s.empty())
            throw ShapeError("[" + a.op.name + "] gradient " + shape_str(a.inputs[0].shape()) + " and labels " +
                             shape_str(s) + " must have one (N, d...) shape");
          s.insert(s.begin() + 1, a.attrs.get<std::int64_t>("classes"));
          return std::vector<Shape>{s};
        },
    .cpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          const Ignore ig = ignore_of(a.attrs);
          const std::int64_t cs = out[0].strides()[1];
          const std::int64_t classes = out[0].shape()[1];
          Shape gs = without_class_dim(out[0].strides());
          const std::int64_t* pl = cpu::ptr<const std::int64_t>(a.inputs[1]);
          cpu::visit(out[0].dtype(), [&]<class T>() {
            const T* pg = cpu::ptr<const T>(a.inputs[0]);
            T* po = cpu::ptr<T>(out[0]);
            cpu::for_each_offset<3>(a.inputs[1].shape(), {&a.inputs[0].strides(), &a.inputs[1].strides(), &gs},
                                    {0, 0, 0}, [&](const std::array<std::int64_t, 3>& o) {
                                      const std::int64_t label = pl[o[1]];
                                      for (std::int64_t c = 0; c < classes; ++c)
                                        po[o[2] + c * cs] =
                                            cpu::store<T>(label == c && !ig.skips(label) ? -cpu::load(pg[o[0]]) : 0.0f);
                                    });
          });
        },
    .gpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          const Ignore ig = ignore_of(a.attrs);
          const Tensor g = gpu::contiguous(a.inputs[0]), labels = gpu::contiguous(a.inputs[1]);
          kernels::launch_nll_backward(out[0].dtype(), device_address(g), device_address(labels),
                                       device_address(out[0]), out[0].numel(), out[0].shape()[1],
                                       inner_of(labels.shape()), ig.index, ig.on, stream_of(a.device));
        },
    .test = {.attrs = {Attrs{{"classes", std::int64_t{5}}}},
             .gradcheck = false,
             .inputs = {{}, {.dtype = DType::i64, .low = 0, .high = 5}},
             .shapes = {{{4}, {4}}, {{3, 2}, {3, 2}}}},
});

// Two outputs of the labels' shape: the per-element loss (0 where ignored) and the mask of
// elements that count (1, or 0 where ignored), which the mean divides by.
const OpRef kNll = register_op({
    .name = "nll_loss",
    .num_inputs = 2,
    .num_outputs = 2,
    .dtypes = dtype_sets::floating,
    .dtype_rule =
        [](const OpArgs& a) {
          DTypePlan p = float_and_labels(a, 0, 1);
          p.outputs = {p.key, p.key};
          return p;
        },
    .shape_rule =
        [](const OpArgs& a) {
          classes_of(a.op.name, a.inputs[0].shape(), a.inputs[1].shape());
          return std::vector<Shape>{a.inputs[1].shape(), a.inputs[1].shape()};
        },
    .cpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          const Ignore ig = ignore_of(a.attrs);
          const Tensor& lp = a.inputs[0];
          const std::int64_t classes = lp.shape()[1], cs = lp.strides()[1];
          Shape ls = without_class_dim(lp.strides());
          const std::int64_t* pl = cpu::ptr<const std::int64_t>(a.inputs[1]);
          cpu::visit(out[0].dtype(), [&]<class T>() {
            const T* pp = cpu::ptr<const T>(lp);
            T* loss = cpu::ptr<T>(out[0]);
            T* valid = cpu::ptr<T>(out[1]);
            cpu::for_each_offset<3>(a.inputs[1].shape(), {&a.inputs[1].strides(), &ls, &out[0].strides()}, {0, 0, 0},
                                    [&](const std::array<std::int64_t, 3>& o) {
                                      const std::int64_t label = pl[o[0]];
                                      if (ig.skips(label)) {
                                        loss[o[2]] = cpu::store<T>(0.0f);
                                        valid[o[2]] = cpu::store<T>(0.0f);
                                        return;
                                      }
                                      if (label < 0 || label >= classes)
                                        throw ValueError("[" + a.op.name + "] label " + std::to_string(label) +
                                                         " is out of range for " + std::to_string(classes) +
                                                         " classes");
                                      loss[o[2]] = cpu::store<T>(-cpu::load(pp[o[1] + label * cs]));
                                      valid[o[2]] = cpu::store<T>(1.0f);
                                    });
          });
        },
    .gpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          const Ignore ig = ignore_of(a.attrs);
          const Tensor lp = gpu::contiguous(a.inputs[0]), labels = gpu::contiguous(a.inputs[1]);
          kernels::launch_nll_forward(out[0].dtype(), device_address(lp), device_address(labels),
                                      device_address(out[0]), device_address(out[1]), labels.numel(), lp.shape()[1],
                                      inner_of(labels.shape()), ig.index, ig.on, stream_of(a.device));
        },
    // The mask does not depend on the log-probabilities; only the loss carries a gradient.
    .vjp = [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
      Attrs attrs = c.attrs();
      attrs.set("classes", c.input(0).shape[1]);
      return {call(kNllBackward, {g[0], c.saved_input(1)}, attrs), Tensor()};
    },
    .differentiable_outputs = 1,  // the mask carries no gradient
    .save = {.inputs = {1}},
    .test = {.attrs = {Attrs{}, Attrs{{"ignore_index", std::int64_t{1}}}},
             .gradcheck = false,
             .inputs = {{}, {.dtype = DType::i64, .low = 0, .high = 5}},
             .shapes = {{{4, 5}, {4}}, {{3, 5, 2}, {3, 2}}}},
});

// loss reduced as asked; `valid` (or nothing: every element counts) is the mean's divisor.
Tensor reduce_loss(const Tensor& loss, const Tensor& valid, Reduction r) {
  switch (r) {
    case Reduction::none:
      return loss;
    case Reduction::sum:
      return sum(loss);
    case Reduction::mean:
      if (!valid.defined()) return div(sum(loss), static_cast<double>(loss.numel()));
      // Counted in f32 at least: f16 stops representing counts exactly past 2048.
      return cast(div(sum(loss), sum(cast(valid, promote_types(valid.dtype(), DType::f32)))), loss.dtype());
  }
  throw ValueError("[loss] unknown reduction");
}

Attrs nll_attrs(std::optional<std::int64_t> ignore_index) {
  Attrs a;
  if (ignore_index) a.set("ignore_index", *ignore_index);
  return a;
}

}  // namespace

Tensor nll_loss(const Tensor& log_probs, const Tensor& labels, Reduction reduction,
                std::optional<std::int64_t> ignore_index) {
  const Tensor inputs[] = {autocast_f32(log_probs), labels};
  std::vector<Tensor> out = dispatch(kNll, inputs, nll_attrs(ignore_index));
  return reduce_loss(out[0], ignore_index ? out[1] : Tensor(), reduction);
}

Tensor cross_entropy(const Tensor& logits_in, const Tensor& labels, Reduction reduction, double label_smoothing,
                     std::optional<std::int64_t> ignore_index) {
  // Under autocast, 16-bit logits (N, C) go to the fused op as they are: it computes in f32
  // anyway and gives the f32 loss a cast would, with no cast of the logits or of their gradient.
  const bool f32_loss = autocast_dtype() && logits_in.defined() && logits_in.dim() == 2 &&
                        (logits_in.dtype() == DType::f16 || logits_in.dtype() == DType::bf16);
  const Tensor logits = f32_loss ? logits_in : autocast_f32(logits_in);
  if (!(label_smoothing >= 0.0 && label_smoothing < 1.0))
    throw ValueError("[cross_entropy] label_smoothing must be in [0, 1); got " + std::to_string(label_smoothing));
  if (logits.defined() && labels.defined()) classes_of("cross_entropy", logits.shape(), labels.shape());
  if (logits.defined() && logits.dim() == 2)
    return fused_cross_entropy(logits, labels, reduction, label_smoothing, ignore_index, f32_loss);
  const Tensor lp = log_softmax(logits, 1);
  const Tensor inputs[] = {lp, labels};
  std::vector<Tensor> out = dispatch(kNll, inputs, nll_attrs(ignore_index));
  Tensor loss = out[0];
  if (label_smoothing > 0.0) {
    Tensor smooth = div(neg(sum(lp, {1}, false)), static_cast<double>(logits.shape()[1]));
    // Selected, not multiplied by the mask: the mean over no element sends 1/0 back, and
    // inf * 0 would turn the ignored rows' gradients into NaN.
    if (ignore_index) smooth = where(ne(out[1], Scalar(0)), smooth, Scalar(0));
    loss = add(mul(loss, 1.0 - label_smoothing), mul(smooth, label_smoothing));
  }
  return reduce_loss(loss, ignore_index ? out[1] : Tensor(), reduction);
}

Tensor mse_loss(const Tensor& a_in, const Tensor& b_in, Reduction reduction) {
  const Tensor a = autocast_f32(a_in), b = autocast_f32(b_in);
  if (a.shape() != b.shape())
    throw ShapeError("[mse_loss] inputs must have one shape; got " + shape_str(a.shape()) + " and " +
                     shape_str(b.shape()));
  if (!is_floating(a.dtype()) || !is_floating(b.dtype()))
    throw DTypeError("[mse_loss] needs floating inputs; got " + std::string(dtype_name(a.dtype())) + " and " +
                     std::string(dtype_name(b.dtype())));
  const Tensor d = sub(a, b);
  return reduce_loss(mul(d, d), Tensor(), reduction);
}

}  // namespace kiln
