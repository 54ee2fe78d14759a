// batch_norm_max_pool2d: a batch norm (and ReLU) whose output only a max pool reads, when the
// pool's windows tile the input (stride = kernel, no padding), as two registry ops. The GPU never
// stores the normalized tensor: the forward is the statistics kernel and one kernel that
// normalizes and pools; the backward finds each window's argmax again from x and is a
// per-channel reduction, then dx, whose blocks add up their channel's sums
// (kernel_templates/norm.cu). Where a conv's input gradient parked the reduction's sums
// (bn_pool_sums.h), dx alone. The CPU references are plain loops in double that round the
// normalized values to x's dtype before pooling, as batch_norm stores them.
#include <cmath>
#include <limits>

#include "bn_pool_sums.h"
#include "core/dtype_sets.h"
#include "kiln/autograd.h"
#include "norm_batch_cpu.h"
#include "norm_common.h"

namespace kiln {

namespace {

using namespace norm_detail;

// x (N, C, H, W) and the pool's kernel (kh, kw) from attrs "kernel" (one value or two).
kernels::BatchNormPoolShape bn_pool_shape(const OpArgs& a, const Tensor& x) {
  const std::string who = "[" + a.op.name + "] ";
  if (x.dim() != 4) throw ShapeError(who + "input must be (N, C, H, W); got " + shape_str(x.shape()));
  const auto k = a.attrs.get_or<std::vector<std::int64_t>>("kernel", {});
  if (k.empty() || k.size() > 2) throw ValueError(who + "kernel must have one or two values");
  const std::int64_t kh = k[0], kw = k.size() == 2 ? k[1] : k[0];
  if (kh < 1 || kw < 1 || kh > x.shape()[2] || kw > x.shape()[3])
    throw ShapeError(who + "kernel (" + std::to_string(kh) + ", " + std::to_string(kw) +
                     ") must be positive and fit the input " + shape_str(x.shape()));
  return {x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3], kh, kw};
}

Shape bn_pooled_shape(const kernels::BatchNormPoolShape& p) { return {p.n, p.channels, p.h / p.kh, p.w / p.kw}; }

std::size_t plane_offset(const kernels::BatchNormPoolShape& p, std::int64_t plane, std::int64_t y, std::int64_t x) {
  return static_cast<std::size_t>((plane * p.h + y) * p.w + x);
}

// Rounds v to dtype t, as a kernel storing it does.
double rounded_to(DType t, double v) {
  return cpu::visit(t, [&]<class T>() { return static_cast<double>(cpu::load(cpu::store<T>(v))); });
}

// The argmax of window (oy, ox) of a plane of values y (its offset in y): the first maximum in
// row-major order, a NaN winning, as max_pool2d picks it.
std::size_t bn_window_argmax(const kernels::BatchNormPoolShape& p, const std::vector<double>& y, std::int64_t plane,
                             std::int64_t oy, std::int64_t ox) {
  std::size_t best = plane_offset(p, plane, oy * p.kh, ox * p.kw);
  for (std::int64_t ky = 0; ky < p.kh; ++ky)
    for (std::int64_t kx = 0; kx < p.kw; ++kx) {
      const std::size_t i = plane_offset(p, plane, oy * p.kh + ky, ox * p.kw + kx);
      if (std::isnan(y[best])) return best;
      if (y[i] > y[best] || std::isnan(y[i])) best = i;
    }
  return best;
}

// y as batch_norm stores it (in x's dtype), for statistics mean and invstd (C).
std::vector<double> bn_stored_values(const BatchNormParams& bp, const kernels::BatchNormPoolShape& p, DType t,
                                     const std::vector<double>& x, const std::vector<double>& mean,
                                     const std::vector<double>& invstd, const std::vector<double>& w,
                                     const std::vector<double>& b) {
  std::vector<double> y(x.size());
  const std::size_t plane_size = static_cast<std::size_t>(p.h * p.w);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t c = (i / plane_size) % static_cast<std::size_t>(p.channels);
    double v = (x[i] - mean[c]) * invstd[c] * w[c] + b[c];
    if (bp.relu && !(v > 0) && !std::isnan(v)) v = 0;
    y[i] = rounded_to(t, v);
  }
  return y;
}

// ---- forward: inputs x, weight, bias, running_mean, running_var; outputs y (pooled), mean, invstd ----

std::vector<Shape> bn_pool_forward_shapes(const OpArgs& a) {
  const Tensor& x = a.inputs[0];
  const kernels::BatchNormPoolShape p = bn_pool_shape(a, x);
  const BatchNormParams bp = batch_norm_params(a.attrs);
  const Shape c{p.channels};
  for (int i = 0; i < 4; ++i)
    if (has(a.attrs, kBatchNormParamNames[i]))
      check_shape(a, kBatchNormParamNames[i], a.inputs[static_cast<std::size_t>(i + 1)], c);
  if (!bp.training && !(bp.rm && bp.rv))
    throw ValueError("[" + a.op.name + "] eval mode needs running_mean and running_var");
  if (bp.training && p.n * p.h * p.w <= 1)
    throw ValueError("[" + a.op.name + "] training needs more than one value per channel; got input " +
                     shape_str(x.shape()));
  check_counter(a);
  return {bn_pooled_shape(p), c, c};
}

void bn_pool_forward_cpu(const OpArgs& a, std::span<Tensor> out) {
  const BatchNormParams bp = batch_norm_params(a.attrs);
  const kernels::BatchNormPoolShape p = bn_pool_shape(a, a.inputs[0]);
  const std::int64_t C = p.channels, S = p.h * p.w;
  const std::vector<double> x = values(a.inputs[0]);
  const std::vector<double> w = bp.weight ? values(a.inputs[1]) : std::vector<double>(C, 1.0);
  const std::vector<double> b = bp.bias ? values(a.inputs[2]) : std::vector<double>(C, 0.0);
  std::vector<double> rm = bp.rm ? values(a.inputs[3]) : std::vector<double>(C);
  std::vector<double> rv = bp.rv ? values(a.inputs[4]) : std::vector<double>(C);
  std::vector<double> mean(C), invstd(C);
  const double m = static_cast<double>(p.n * S);
  for (std::int64_t c = 0; c < C; ++c) {
    if (!bp.training) {
      mean[c] = rm[c];
      invstd[c] = 1.0 / std::sqrt(rv[c] + bp.eps);
      continue;
    }
    double sum = 0, sq = 0;
    for (std::int64_t n = 0; n < p.n; ++n)
      for (std::int64_t s = 0; s < S; ++s) sum += x[static_cast<std::size_t>((n * C + c) * S + s)];
    const double mu = sum / m;
    for (std::int64_t n = 0; n < p.n; ++n)
      for (std::int64_t s = 0; s < S; ++s) {
        const double d = x[static_cast<std::size_t>((n * C + c) * S + s)] - mu;
        sq += d * d;
      }
    mean[c] = std::isnan(sq) ? std::numeric_limits<double>::quiet_NaN() : mu;
    invstd[c] = 1.0 / std::sqrt(sq / m + bp.eps);
    rm[c] = (1 - bp.momentum) * rm[c] + bp.momentum * mean[c];
    rv[c] = (1 - bp.momentum) * rv[c] + bp.momentum * sq / (m - 1);
  }
  const std::vector<double> y = bn_stored_values(bp, p, a.inputs[0].dtype(), x, mean, invstd, w, b);
  const std::int64_t oh = p.h / p.kh, ow = p.w / p.kw;
  std::vector<double> pooled_y(static_cast<std::size_t>(p.n * C * oh * ow));
  for (std::int64_t plane = 0; plane < p.n * C; ++plane)
    for (std::int64_t oy = 0; oy < oh; ++oy)
      for (std::int64_t ox = 0; ox < ow; ++ox)
        pooled_y[static_cast<std::size_t>((plane * oh + oy) * ow + ox)] = y[bn_window_argmax(p, y, plane, oy, ox)];
  store_values(out[0], pooled_y);
  store_values(out[1], mean);
  store_values(out[2], invstd);
  if (bp.training && bp.rm) store_values(a.inputs[3], rm);
  if (bp.training && bp.rv) store_values(a.inputs[4], rv);
  count_batch_cpu(a);
}

void bn_pool_forward_gpu(const OpArgs& a, std::span<Tensor> out) {
  const kernels::BatchNormPoolShape p = bn_pool_shape(a, a.inputs[0]);
  batch_norm_forward_gpu(a, out, [&](const kernels::BatchNormForward& f, const kernels::NormSplit& split) {
    kernels::launch_batch_norm_max_pool(f, p, split, stream_of(a.device));
  });
}

// ---- backward: inputs g (pooled), x, weight, bias, mean, invstd; outputs dx, dweight, dbias.
// dy' is g at each window's argmax where the stored max is positive (any, without the ReLU). ----

DTypePlan bn_pool_backward_dtypes(const OpArgs& a) {
  const BatchNormParams bp = batch_norm_params(a.attrs);
  std::vector<Tensor> params;
  if (bp.weight) params.push_back(a.inputs[2]);
  if (bp.bias) params.push_back(a.inputs[3]);
  return norm_plan(a, a.inputs[1].dtype(), param_dtype(a.inputs[1].dtype(), params),
                   {{Role::x, true, "gradient"},
                    {Role::x},
                    {Role::param, bp.weight, "weight"},
                    {Role::param, bp.bias, "bias"},
                    {Role::stats},
                    {Role::stats}},
                   {Role::x, Role::param, Role::param});
}

std::vector<Shape> bn_pool_backward_shapes(const OpArgs& a) {
  const Tensor& x = a.inputs[1];
  const kernels::BatchNormPoolShape p = bn_pool_shape(a, x);
  const BatchNormParams bp = batch_norm_params(a.attrs);
  const Shape c{p.channels};
  check_shape(a, "gradient", a.inputs[0], bn_pooled_shape(p));
  if (bp.weight) check_shape(a, "weight", a.inputs[2], c);
  if (bp.bias) check_shape(a, "bias", a.inputs[3], c);
  check_shape(a, "mean", a.inputs[4], c);
  check_shape(a, "invstd", a.inputs[5], c);
  return {x.shape(), c, c};
}

void bn_pool_backward_cpu(const OpArgs& a, std::span<Tensor> out) {
  const BatchNormParams bp = batch_norm_params(a.attrs);
  const kernels::BatchNormPoolShape p = bn_pool_shape(a, a.inputs[1]);
  const std::int64_t C = p.channels, S = p.h * p.w, oh = p.h / p.kh, ow = p.w / p.kw;
  const std::vector<double> g = values(a.inputs[0]), x = values(a.inputs[1]);
  const std::vector<double> w = bp.weight ? values(a.inputs[2]) : std::vector<double>(C, 1.0);
  const std::vector<double> b = bp.bias ? values(a.inputs[3]) : std::vector<double>(C, 0.0);
  const std::vector<double> mean = values(a.inputs[4]), invstd = values(a.inputs[5]);
  const std::vector<double> y = bn_stored_values(bp, p, a.inputs[1].dtype(), x, mean, invstd, w, b);
  std::vector<double> dy(x.size(), 0.0);  // the unpooled gradient, ReLU's mask applied
  for (std::int64_t plane = 0; plane < p.n * C; ++plane)
    for (std::int64_t oy = 0; oy < oh; ++oy)
      for (std::int64_t ox = 0; ox < ow; ++ox) {
        const std::size_t i = bn_window_argmax(p, y, plane, oy, ox);
        if (!bp.relu || y[i] > 0) dy[i] = g[static_cast<std::size_t>((plane * oh + oy) * ow + ox)];
      }
  std::vector<double> dx(x.size()), dw(C), db(C);
  const double m = static_cast<double>(p.n * S);
  for (std::int64_t c = 0; c < C; ++c) {
    double sdy = 0, sdx = 0;
    for (std::int64_t n = 0; n < p.n; ++n)
      for (std::int64_t s = 0; s < S; ++s) {
        const std::size_t i = static_cast<std::size_t>((n * C + c) * S + s);
        sdy += dy[i];
        sdx += dy[i] * (x[i] - mean[c]);
      }
    db[c] = sdy;
    dw[c] = sdx * invstd[c];
    for (std::int64_t n = 0; n < p.n; ++n)
      for (std::int64_t s = 0; s < S; ++s) {
        const std::size_t i = static_cast<std::size_t>((n * C + c) * S + s);
        const double xhat = (x[i] - mean[c]) * invstd[c];
        const double d = bp.training ? dy[i] - db[c] / m - xhat * (dw[c] / m) : dy[i];
        dx[i] = w[c] * invstd[c] * d;
      }
  }
  store_values(out[0], dx);
  store_values(out[1], dw);
  store_values(out[2], db);
}

void bn_pool_backward_gpu(const OpArgs& a, std::span<Tensor> out) {
  const BatchNormParams bp = batch_norm_params(a.attrs);
  Tensor in[6];
  for (std::size_t i = 0; i < 6; ++i)
    if ((i != 2 || bp.weight) && (i != 3 || bp.bias)) in[i] = gpu::contiguous(a.inputs[i]);
  const kernels::BatchNormPoolShape p = bn_pool_shape(a, in[1]);
  const kernels::NormSplit split = kernels::batch_norm_max_pool_split(p, a.device.index());
  const DType acc = acc_of(out[0].dtype());
  // Sums a conv's input gradient parked beside g, for exactly these tensors.
  const Tensor parked = bp.training && p.kh == 2 && p.kw == 2
                            ? bn_pool_sums::take(in[0], {in[1], in[2], in[3], in[4], in[5], bp.relu})
                            : Tensor();
  const Tensor parts = parked.defined() ? parked : empty({split.scratch}, {.dtype = acc, .device = a.device});
  const kernels::BatchNormBackward args{.t = out[0].dtype(),
                                        .p = out[1].dtype(),
                                        .g = device_address(in[0]),
                                        .x = device_address(in[1]),
                                        .weight = address_or_0(in[2]),
                                        .mean = device_address(in[4]),
                                        .invstd = device_address(in[5]),
                                        .bias = address_or_0(in[3]),
                                        .dx = device_address(out[0]),
                                        .dweight = device_address(out[1]),
                                        .dbias = device_address(out[2]),
                                        .parts = device_address(parts),
                                        .training = bp.training,
                                        .relu = bp.relu};
  if (parked.defined())
    kernels::launch_batch_norm_max_pool_backward_dx(args, p, parked.shape()[1], stream_of(a.device));
  else
    kernels::launch_batch_norm_max_pool_backward(args, p, split, stream_of(a.device));
}

using Dims = std::vector<std::int64_t>;

// Test cases: batch_norm's attribute sets with a 2x2 pool, and a 3x2 one in training with the
// ReLU; 4-D inputs whose sides the windows divide or not (5 x 7), N = 1, several blocks a channel.
std::vector<Attrs> bn_pool_test_attrs(bool backward) {
  std::vector<Attrs> sets;
  for (bool training : {true, false})
    for (bool relu : {false, true})
      for (bool affine : {true, false}) {
        Attrs a{
            {"training", training}, {"relu", relu}, {"has_weight", affine}, {"has_bias", affine}, {"kernel", Dims{2}}};
        if (!backward) {
          a.set("momentum", 0.3);
          a.set("has_running_mean", affine || !training);
          a.set("has_running_var", affine || !training);
        }
        sets.push_back(a);
      }
  if (!backward) sets.push_back(Attrs{{"training", true}, {"relu", true}, {"kernel", Dims{3, 2}}});
  return sets;
}
const Shape kBnPoolTestInputs[] = {{2, 3, 6, 8}, {1, 3, 5, 7}, {9, 2, 38, 42}};

std::vector<std::vector<Shape>> bn_pool_forward_test_shapes() {
  std::vector<std::vector<Shape>> sets;
  for (const Shape& x : kBnPoolTestInputs) sets.push_back({x, {x[1]}, {x[1]}, {x[1]}, {x[1]}, {}});
  return sets;
}
std::vector<std::vector<Shape>> bn_pool_backward_test_shapes() {
  std::vector<std::vector<Shape>> sets;
  for (const Shape& x : kBnPoolTestInputs)
    sets.push_back({{x[0], x[1], x[2] / 2, x[3] / 2}, x, {x[1]}, {x[1]}, {x[1]}, {x[1]}});
  return sets;
}

const OpRef kBnPoolBackward = register_op({
    .name = "batch_norm_max_pool2d_backward",
    .num_inputs = 6,
    .num_outputs = 3,
    .dtypes = dtype_sets::floating,
    .dtype_rule = bn_pool_backward_dtypes,
    .shape_rule = bn_pool_backward_shapes,
    .cpu = bn_pool_backward_cpu,
    .gpu = bn_pool_backward_gpu,
    .test = {.attrs = bn_pool_test_attrs(true),
             .gradcheck = false,
             .tolerance_scale = 4,
             .inputs = {{}, {}, {}, {}, {}, {.low = 0.5, .high = 2}},
             .shapes = bn_pool_backward_test_shapes()},
});

const OpRef kBnPool = register_op({
    .name = "batch_norm_max_pool2d",
    .num_inputs = 6,
    .num_outputs = 3,
    .dtypes = dtype_sets::floating,
    .dtype_rule = batch_norm_forward_dtypes,
    .shape_rule = bn_pool_forward_shapes,
    .cpu = bn_pool_forward_cpu,
    .gpu = bn_pool_forward_gpu,
    // As batch_norm's: mean and invstd are state for the backward, not differentiable outputs.
    .vjp = [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
      const BatchNormParams bp = batch_norm_params(c.attrs());
      const Tensor x = c.saved_input(0);
      const Tensor in[] = {g[0],
                           x,
                           bp.weight ? c.saved_input(1) : x,
                           bp.bias ? c.saved_input(2) : x,
                           c.saved_output(1),
                           c.saved_output(2)};
      const Tensor into[] = {Tensor(), bp.weight ? c.grad_sink(1) : Tensor(), bp.bias ? c.grad_sink(2) : Tensor()};
      Attrs attrs{{"training", bp.training},
                  {"relu", bp.relu},
                  {"has_weight", bp.weight},
                  {"has_bias", bp.bias},
                  {"kernel", c.attrs().get<Dims>("kernel")}};
      return batch_norm_input_grads(c, bp, dispatch(kBnPoolBackward, in, attrs, into));
    },
    .differentiable_outputs = 1,
    .save = {.inputs = {0, 1, 2}, .outputs = {1, 2}},
    .test = {.attrs = bn_pool_test_attrs(false),
             .tolerance_scale = 4,
             .inputs = {{}, {}, {}, {}, {.low = 0.5, .high = 2}},
             .shapes = bn_pool_forward_test_shapes()},
});

}  // namespace

namespace bn_pool_sums {

std::optional<Consumer> consumer_of(const Node* producer) {
  if (!producer || &producer->op() != &static_cast<const OpDef&>(kBnPool)) return std::nullopt;
  const BatchNormParams bp = batch_norm_params(producer->attrs());
  const auto k = producer->attrs().get_or<std::vector<std::int64_t>>("kernel", {});
  const bool two_by_two = (k.size() == 1 && k[0] == 2) || (k.size() == 2 && k[0] == 2 && k[1] == 2);
  if (!bp.training || !two_by_two) return std::nullopt;
  const std::vector<SavedTensor>&in = producer->saved_inputs(), &out = producer->saved_outputs();
  auto saved = [](const std::vector<SavedTensor>& v, std::size_t i) {
    return i < v.size() && v[i].defined() && v[i].data.version() == v[i].version ? v[i].data : Tensor();
  };
  Consumer c{saved(in, 0),
             bp.weight ? saved(in, 1) : Tensor(),
             bp.bias ? saved(in, 2) : Tensor(),
             saved(out, 1),
             saved(out, 2),
             bp.relu};
  if (!c.x.defined() || !c.mean.defined() || !c.invstd.defined() || (bp.weight && !c.weight.defined()) ||
      (bp.bias && !c.bias.defined()))
    return std::nullopt;
  return c;
}

}  // namespace bn_pool_sums

Tensor batch_norm_max_pool2d(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                             const Tensor& weight, const Tensor& bias, bool training, double momentum, double eps,
                             Activation activation, std::vector<std::int64_t> kernel,
                             const Tensor& num_batches_tracked) {
  return norm_detail::dispatch_batch_norm(kBnPool, x, running_mean, running_var, weight, bias, training, momentum, eps,
                                          activation, num_batches_tracked, Attrs{{"kernel", std::move(kernel)}});
}

}  // namespace kiln
