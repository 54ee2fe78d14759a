// batch_norm as two registry ops: the forward (on the GPU a one-pass statistics kernel that
// also updates the running statistics, then one apply kernel with the optional ReLU; eval:
// the apply kernel alone) and its backward (a per-channel reduction, then dx). The CPU
// references below are plain loops in double, independent of the kernels (norm.cu) and of
// the CPU fast path (norm_batch_cpu.h).
#include <cmath>
#include <limits>

#include "conv_totals.h"
#include "core/dtype_sets.h"
#include "cpu_fast.h"
#include "kiln/nn_functional.h"
#include "norm_batch_cpu.h"
#include "norm_common.h"

namespace kiln {

namespace {

using namespace norm_detail;



void check_input(const OpArgs& a, const Tensor& x) {
  if (x.dim() < 2)
    throw ShapeError("[" + a.op.name + "] input must be (N, C) or (N, C, d...); got " + shape_str(x.shape()));
}

// ---- forward: inputs x, weight, bias, running_mean, running_var; outputs y, mean, invstd ----

std::vector<Shape> bn_forward_shapes(const OpArgs& a) {
  const Tensor& x = a.inputs[0];
  check_input(a, x);
  const BatchNormParams p = batch_norm_params(a.attrs);
  const Shape c{x.shape()[1]};
  for (int i = 0; i < 4; ++i)
    if (has(a.attrs, kBatchNormParamNames[i]))
      check_shape(a, kBatchNormParamNames[i], a.inputs[static_cast<std::size_t>(i + 1)], c);
  if (!p.training && !(p.rm && p.rv))
    throw ValueError("[" + a.op.name + "] eval mode needs running_mean and running_var");
  if (p.training && batch_norm_shape(x).per_channel <= 1)
    throw ValueError("[" + a.op.name + "] training needs more than one value per channel; got input " +
                     shape_str(x.shape()));
  check_counter(a);
  return {x.shape(), c, c};
}

void bn_forward_cpu(const OpArgs& a, std::span<Tensor> out) {
  const BatchNormParams p = batch_norm_params(a.attrs);
  const kernels::BatchNormShape sh = batch_norm_shape(a.inputs[0]);
  const std::int64_t C = sh.channels, S = sh.spatial, N = a.inputs[0].shape()[0];
  const std::vector<double> x = values(a.inputs[0]);
  const std::vector<double> w = p.weight ? values(a.inputs[1]) : std::vector<double>(C, 1.0);
  const std::vector<double> b = p.bias ? values(a.inputs[2]) : std::vector<double>(C, 0.0);
  std::vector<double> rm = p.rm ? values(a.inputs[3]) : std::vector<double>(C);
  std::vector<double> rv = p.rv ? values(a.inputs[4]) : std::vector<double>(C);
  std::vector<double> y(x.size()), mean(C), invstd(C);
  auto at = [&](std::int64_t n, std::int64_t c, std::int64_t s) {
    return static_cast<std::size_t>((n * C + c) * S + s);
  };
  const double m = static_cast<double>(sh.per_channel);
  for (std::int64_t c = 0; c < C; ++c) {
    if (p.training) {
      double sum = 0, sq = 0;
      for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t s = 0; s < S; ++s) sum += x[at(n, c, s)];
      const double mu = sum / m;
      for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t s = 0; s < S; ++s) sq += (x[at(n, c, s)] - mu) * (x[at(n, c, s)] - mu);
      // A NaN or Inf in the channel: NaN statistics (norm.cu's checked_mean).
      mean[c] = std::isnan(sq) ? std::numeric_limits<double>::quiet_NaN() : mu;
      invstd[c] = 1.0 / std::sqrt(sq / m + p.eps);
      rm[c] = (1 - p.momentum) * rm[c] + p.momentum * mean[c];
      rv[c] = (1 - p.momentum) * rv[c] + p.momentum * sq / (m - 1);
    } else {
      mean[c] = rm[c];
      invstd[c] = 1.0 / std::sqrt(rv[c] + p.eps);
    }
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t s = 0; s < S; ++s) {
        double v = (x[at(n, c, s)] - mean[c]) * invstd[c] * w[c] + b[c];
        if (p.relu && !(v > 0) && !std::isnan(v)) v = 0;
        y[at(n, c, s)] = v;
      }
  }
  store_values(out[0], y);
  store_values(out[1], mean);
  store_values(out[2], invstd);
  if (p.training && p.rm) store_values(a.inputs[3], rm);
  if (p.training && p.rv) store_values(a.inputs[4], rv);
  count_batch_cpu(a);
}

void bn_forward_gpu(const OpArgs& a, std::span<Tensor> out) {
  const kernels::BatchNormShape sh = batch_norm_shape(a.inputs[0]);
  batch_norm_forward_gpu(a, out, [&](const kernels::BatchNormForward& f, const kernels::NormSplit& split) {
    kernels::launch_batch_norm(f, sh, split, stream_of(a.device));
  });
}

// ---- backward: inputs g, x, y (read with relu), weight, mean, invstd; outputs dx, dweight,
// dbias. dweight = sum dy' * xhat and dbias = sum dy' per channel, where dy' is g, or g where
// y > 0 with the fused ReLU; they come in the weight's dtype (the compute dtype without one).

DType bn_backward_param_dtype(const OpArgs& a) {
  return param_dtype(a.inputs[1].dtype(),
                     has(a.attrs, "weight") ? std::vector<Tensor>{a.inputs[3]} : std::vector<Tensor>{});
}

DTypePlan bn_backward_dtypes(const OpArgs& a) {
  const BatchNormParams p = batch_norm_params(a.attrs);
  return norm_plan(a, a.inputs[1].dtype(), bn_backward_param_dtype(a),
                   {{Role::x, true, "gradient"},
                    {Role::x},
                    {Role::x, p.relu, "output"},
                    {Role::param, p.weight, "weight"},
                    {Role::stats},
                    {Role::stats}},
                   {Role::x, Role::param, Role::param});
}

std::vector<Shape> bn_backward_shapes(const OpArgs& a) {
  const Tensor &g = a.inputs[0], &x = a.inputs[1];
  check_input(a, x);
  const BatchNormParams p = batch_norm_params(a.attrs);
  const Shape c{x.shape()[1]};
  check_shape(a, "gradient", g, x.shape());
  if (p.relu) check_shape(a, "output", a.inputs[2], x.shape());
  if (p.weight) check_shape(a, "weight", a.inputs[3], c);
  check_shape(a, "mean", a.inputs[4], c);
  check_shape(a, "invstd", a.inputs[5], c);
  return {x.shape(), c, c};
}

void bn_backward_cpu(const OpArgs& a, std::span<Tensor> out) {
  const BatchNormParams p = batch_norm_params(a.attrs);
  const kernels::BatchNormShape sh = batch_norm_shape(a.inputs[1]);
  const std::int64_t C = sh.channels, S = sh.spatial, N = a.inputs[1].shape()[0];
  const std::vector<double> g = values(a.inputs[0]), x = values(a.inputs[1]);
  const std::vector<double> y = p.relu ? values(a.inputs[2]) : std::vector<double>();
  const std::vector<double> w = p.weight ? values(a.inputs[3]) : std::vector<double>(C, 1.0);
  const std::vector<double> mean = values(a.inputs[4]), invstd = values(a.inputs[5]);
  std::vector<double> dx(x.size()), dw(C), db(C);
  auto at = [&](std::int64_t n, std::int64_t c, std::int64_t s) {
    return static_cast<std::size_t>((n * C + c) * S + s);
  };
  auto dy = [&](std::size_t i) { return p.relu && !(y[i] > 0) ? 0.0 : g[i]; };
  const double m = static_cast<double>(sh.per_channel);
  for (std::int64_t c = 0; c < C; ++c) {
    double sdy = 0, sdx = 0;
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t s = 0; s < S; ++s) {
        sdy += dy(at(n, c, s));
        sdx += dy(at(n, c, s)) * (x[at(n, c, s)] - mean[c]);
      }
    db[c] = sdy;
    dw[c] = sdx * invstd[c];
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t s = 0; s < S; ++s) {
        const std::size_t i = at(n, c, s);
        const double xhat = (x[i] - mean[c]) * invstd[c];
        const double d = p.training ? dy(i) - db[c] / m - xhat * (dw[c] / m) : dy(i);
        dx[i] = w[c] * invstd[c] * d;
      }
  }
  store_values(out[0], dx);
  store_values(out[1], dw);
  store_values(out[2], db);
}

void bn_backward_gpu(const OpArgs& a, std::span<Tensor> out) {
  const BatchNormParams p = batch_norm_params(a.attrs);
  Tensor in[6];
  for (std::size_t i = 0; i < 6; ++i)
    if ((i != 2 || p.relu) && (i != 3 || p.weight)) in[i] = gpu::contiguous(a.inputs[i]);
  const kernels::BatchNormShape sh = batch_norm_shape(in[1]);
  const kernels::NormSplit split = kernels::batch_norm_split(sh, a.device.index());
  const DType acc = acc_of(out[0].dtype());
  const Tensor parts = empty({split.scratch}, {.dtype = acc, .device = a.device});
  const Tensor sums = empty({2 * sh.channels}, {.dtype = acc, .device = a.device});
  kernels::launch_batch_norm_backward({.t = out[0].dtype(),
                                       .p = out[1].dtype(),
                                       .g = device_address(in[0]),
                                       .x = device_address(in[1]),
                                       .y = address_or_0(in[2]),
                                       .weight = address_or_0(in[3]),
                                       .mean = device_address(in[4]),
                                       .invstd = device_address(in[5]),
                                       .dx = device_address(out[0]),
                                       .dweight = device_address(out[1]),
                                       .dbias = device_address(out[2]),
                                       .sums = device_address(sums),
                                       .parts = device_address(parts),
                                       .training = p.training,
                                       .relu = p.relu},
                                      sh, split, stream_of(a.device));
}

// Test cases: 4-D and 2-D inputs, odd sizes, N = 1, enough values per channel for several
// blocks; every optional input present or not, eval and training, the ReLU fused or not.
// Running variances stay positive.
std::vector<Attrs> bn_test_attrs(bool backward) {
  std::vector<Attrs> sets;
  for (bool training : {true, false})
    for (bool relu : {false, true})
      for (bool affine : {true, false}) {
        Attrs a{{"training", training}, {"relu", relu}, {"has_weight", affine}, {"has_bias", affine}};
        if (!backward) {
          a.set("momentum", 0.3);
          a.set("has_running_mean", affine || !training);
          a.set("has_running_var", affine || !training);
        }
        sets.push_back(a);
      }
  sets.push_back(Attrs{{"training", true},
                       {"has_weight", true},
                       {"has_bias", false},
                       {"has_running_mean", false},
                       {"has_running_var", true}});
  return sets;
}
// counter: a last input for the (absent) batch counter.
std::vector<std::vector<Shape>> test_shapes(int per_channel_inputs, int leading, bool counter = false) {
  std::vector<std::vector<Shape>> sets;
  for (const Shape& x : {Shape{2, 3, 5, 7}, Shape{4, 3}, Shape{1, 3, 5, 7}, Shape{1, 5}, Shape{9, 2, 37, 41}}) {
    std::vector<Shape> set(static_cast<std::size_t>(leading), x);
    for (int i = 0; i < per_channel_inputs; ++i) set.push_back({x[1]});
    if (counter) set.push_back({});
    sets.push_back(set);
  }
  return sets;
}

const OpRef kBatchNormBackward = register_op({
    .name = "batch_norm_backward",
    .num_inputs = 6,
    .num_outputs = 3,
    .dtypes = dtype_sets::floating,
    .dtype_rule = bn_backward_dtypes,
    .shape_rule = bn_backward_shapes,
    .cpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          // g, x and y in f32 for half x; the parameters and statistics are read in any dtype.
          if (!batch_norm_backward_fast(a, out) && !cpu_fast::through_f32(a, out, {0, 1, 2}, batch_norm_backward_fast))
            bn_backward_cpu(a, out);
        },
    .cpu_reference = bn_backward_cpu,
    .gpu = bn_backward_gpu,
    // inputs g, x, y, weight, then mean and invstd (C): shapes (x, x, x, C, C, C).
    .test = {.attrs = bn_test_attrs(true), .gradcheck = false, .tolerance_scale = 4, .shapes = test_shapes(3, 3)},
});

const OpRef kBatchNorm = register_op({
    .name = "batch_norm",
    .num_inputs = 6,
    .num_outputs = 3,
    .dtypes = dtype_sets::floating,
    .dtype_rule = batch_norm_forward_dtypes,
    .shape_rule = bn_forward_shapes,
    .cpu =
        [](const OpArgs& a, std::span<Tensor> out) {
          // x in f32 for half x: the running statistics it updates stay the tensors they are.
          if (batch_norm_forward_fast(a, out) || cpu_fast::through_f32(a, out, {0}, batch_norm_forward_fast))
            count_batch_cpu(a);
          else
            bn_forward_cpu(a, out);
        },
    .cpu_reference = bn_forward_cpu,
    .gpu = bn_forward_gpu,
    // mean and invstd are state for the backward pass, not differentiable outputs.
    .vjp = [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
      const BatchNormParams p = batch_norm_params(c.attrs());
      const Tensor x = c.saved_input(0);
      const Tensor in[] = {g[0],
                           x,
                           p.relu ? c.saved_output(0) : x,
                           p.weight ? c.saved_input(1) : x,
                           c.saved_output(1),
                           c.saved_output(2)};
      // In a compiled step dweight and dbias may land in the parameters' .grad() buffers.
      const Tensor into[] = {Tensor(), p.weight ? c.grad_sink(1) : Tensor(), p.bias ? c.grad_sink(2) : Tensor()};
      Attrs attrs{{"training", p.training}, {"relu", p.relu}, {"has_weight", p.weight}};
      return batch_norm_input_grads(c, p, dispatch(kBatchNormBackward, in, attrs, into));
    },
    .differentiable_outputs = 1,
    .save = {.inputs = {0, 1}, .outputs = {0, 1, 2}},
    .test = {.attrs = bn_test_attrs(false),
             .tolerance_scale = 4,
             .inputs = {{}, {}, {}, {}, {.low = 0.5, .high = 2}},
             .shapes = test_shapes(4, 1, true)},
});

}  // namespace

namespace norm_detail {

std::vector<Tensor> batch_norm_input_grads(const VjpContext& c, const BatchNormParams& p,
                                           const std::vector<Tensor>& r) {
  // Eval normalises with the running statistics: y depends on them (rarely asked for).
  // With s = weight * invstd: drm = -s * dbias, drv = -s * invstd * dweight / 2.
  Tensor drm, drv;
  if (!p.training && (c.needs_grad(3) || c.needs_grad(4))) {
    const Tensor is = c.saved_output(2), s = p.weight ? mul(is, c.saved_input(1)) : is;
    if (c.needs_grad(3)) drm = neg(mul(s, r[2]));
    if (c.needs_grad(4)) drv = mul(mul(s, is), r[1]) * -0.5;
  }
  return {c.needs_grad(0) ? r[0] : Tensor(),
          p.weight && c.needs_grad(1) ? r[1] : Tensor(),
          p.bias && c.needs_grad(2) ? r[2] : Tensor(),
          drm,
          drv,
          Tensor()};
}

void batch_norm_forward_gpu(const OpArgs& a, std::span<Tensor> out, const BatchNormLaunch& launch) {
  const BatchNormParams p = batch_norm_params(a.attrs);
  const Tensor x = gpu::contiguous(a.inputs[0]);
  auto param = [&](bool present, int i) {
    return present ? gpu::contiguous(a.inputs[static_cast<std::size_t>(i)]) : Tensor();
  };
  const Tensor w = param(p.weight, 1), b = param(p.bias, 2), rm = param(p.rm, 3), rv = param(p.rv, 4);
  const kernels::NormSplit split = kernels::batch_norm_split(batch_norm_shape(x), a.device.index());
  // The sums the conv that wrote x took (conv_totals.h) spare the statistics kernel: f64 totals,
  // or its blocks' f32 partials (2 * C, rows), added up by the kernels.
  const Tensor totals = p.training && out[1].dtype() == DType::f32 ? conv_totals::take(a.inputs[0]) : Tensor();
  const bool partials = totals.defined() && totals.dtype() == DType::f32;
  const Tensor merged = partials ? empty({totals.shape()[0]}, {.dtype = DType::f64, .device = a.device}) : Tensor();
  const Tensor parts = p.training && !totals.defined()
                           ? empty({split.scratch}, {.dtype = out[1].dtype(), .device = a.device})
                           : Tensor();
  // The statistics kernel counts the batch; without channels there is none to do it.
  const bool count = counts_batches(a.attrs);
  if (count && batch_norm_shape(x).channels == 0) Tensor(a.inputs[kCounterInput]).add_(1);
  launch({.t = x.dtype(),
          .p = param_dtype(x.dtype(), present_params(a)),  // the plan's
          .x = device_address(x),
          .weight = address_or_0(w),
          .bias = address_or_0(b),
          .running_mean = address_or_0(rm),
          .running_var = address_or_0(rv),
          .mean = device_address(out[1]),
          .invstd = device_address(out[2]),
          .y = device_address(out[0]),
          .parts = address_or_0(parts),
          .tracked = count ? device_address(a.inputs[kCounterInput]) : rt::DevicePtr(0),
          .totals = partials ? 0 : address_or_0(totals),
          .conv_parts = partials ? device_address(totals) : 0,
          .merged = address_or_0(merged),
          .conv_rows = partials ? totals.shape()[1] : 0,
          .training = p.training,
          .relu = p.relu,
          .momentum = p.momentum,
          .eps = p.eps},
         split);
  // Running statistics the kernel updated in a contiguous copy go back to the caller's view.
  if (p.training && p.rm && !rm.is_same(a.inputs[3])) gpu::copy(rm, a.inputs[3]);
  if (p.training && p.rv && !rv.is_same(a.inputs[4])) gpu::copy(rv, a.inputs[4]);
}

// A running statistic the op can update in place: the parameters' dtype and contiguous.
Tensor staged(const Tensor& t, DType p) {
  if (!t.defined() || (t.dtype() == p && t.is_contiguous())) return t;
  NoGradGuard no_grad;
  return t.to(p).contiguous();
}

Tensor dispatch_batch_norm(const OpDef& op, const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                           const Tensor& weight, const Tensor& bias, bool training, double momentum, double eps,
                           Activation activation, const Tensor& num_batches_tracked, const Attrs& extra) {
  const DType p =
      is_floating(x.dtype()) ? param_dtype(x.dtype(), {weight, bias, running_mean, running_var}) : x.dtype();
  const Tensor rm = training ? staged(running_mean, p) : running_mean;
  const Tensor rv = training ? staged(running_var, p) : running_var;
  Attrs attrs = extra;
  attrs.set("training", training);
  attrs.set("relu", activation == Activation::relu);
  attrs.set("momentum", momentum);
  attrs.set("eps", eps);
  attrs.set("has_weight", weight.defined());
  attrs.set("has_bias", bias.defined());
  attrs.set("has_running_mean", rm.defined());
  attrs.set("has_running_var", rv.defined());
  attrs.set("has_num_batches_tracked", num_batches_tracked.defined());
  auto or_x = [&](const Tensor& t) { return t.defined() ? t : x; };
  const Tensor inputs[] = {x, or_x(weight), or_x(bias), or_x(rm), or_x(rv), or_x(num_batches_tracked)};
  Tensor y = dispatch(op, inputs, attrs)[0];
  if (training) {
    NoGradGuard no_grad;
    if (num_batches_tracked.defined()) bump_version(num_batches_tracked);
    for (auto [target, used] : {std::pair{running_mean, rm}, std::pair{running_var, rv}}) {
      if (!target.defined()) continue;
      if (used.is_same(target))
        bump_version(target);
      else
        Tensor(target).copy_(used);
    }
  }
  return y;
}

}  // namespace norm_detail

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps, Activation activation,
                  const Tensor& num_batches_tracked) {
  return norm_detail::dispatch_batch_norm(kBatchNorm, x, running_mean, running_var, weight, bias, training, momentum,
                                          eps, activation, num_batches_tracked, {});
}

}  // namespace kiln
