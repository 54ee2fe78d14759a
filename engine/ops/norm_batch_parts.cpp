// The stages of a training batch norm as ops (norm_batch_parts.h): batch_norm_stats,
// batch_norm_backward_reduce and batch_norm_backward_elemt. The GPU runs norm.cu's kernels one
// at a time (batch_norm runs them back to back); the CPU references are plain loops in double.
#include "core/dtype_sets.h"
#include "norm_batch_parts.h"

#include <cmath>
#include <limits>

#include "norm_common.h"

namespace kiln {

namespace {

using namespace norm_detail;


Shape check_x(const OpArgs& a, const Tensor& x) {
  if (x.dim() < 2)
    throw ShapeError("[" + a.op.name + "] input must be (N, C) or (N, C, d...); got " + shape_str(x.shape()));
  return Shape{x.shape()[1]};
}

std::size_t at(std::int64_t n, std::int64_t c, std::int64_t s, std::int64_t C, std::int64_t S) {
  return static_cast<std::size_t>((n * C + c) * S + s);
}

// dy' of element i: g, or 0 where the fused ReLU's output was not positive.
double masked(const std::vector<double>& g, const std::vector<double>& y, bool relu, std::size_t i) {
  return relu && !(y[i] > 0) ? 0.0 : g[i];
}

// ---- batch_norm_stats: x -> mean, invstd (C); attrs eps ----

void stats_cpu(const OpArgs& a, std::span<Tensor> out) {
  const kernels::BatchNormShape sh = batch_norm_shape(a.inputs[0]);
  const std::int64_t C = sh.channels, S = sh.spatial, N = a.inputs[0].shape()[0];
  const double eps = a.attrs.get_or<double>("eps", 1e-5), m = static_cast<double>(sh.per_channel);
  const std::vector<double> x = values(a.inputs[0]);
  std::vector<double> mean(C), invstd(C);
  for (std::int64_t c = 0; c < C; ++c) {
    double sum = 0, sq = 0;
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t s = 0; s < S; ++s) sum += x[at(n, c, s, C, S)];
    const double mu = sum / m;
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t s = 0; s < S; ++s) sq += (x[at(n, c, s, C, S)] - mu) * (x[at(n, c, s, C, S)] - mu);
    mean[c] = std::isnan(sq) ? std::numeric_limits<double>::quiet_NaN() : mu;  // as norm.cu's checked_mean
    invstd[c] = 1.0 / std::sqrt(sq / m + eps);
  }
  store_values(out[0], mean);
  store_values(out[1], invstd);
}

void stats_gpu(const OpArgs& a, std::span<Tensor> out) {
  const Tensor x = gpu::contiguous(a.inputs[0]);
  const kernels::BatchNormShape sh = batch_norm_shape(x);
  const kernels::NormSplit split = kernels::batch_norm_split(sh, a.device.index());
  const Tensor parts = empty({split.scratch}, {.dtype = out[0].dtype(), .device = a.device});
  kernels::launch_batch_norm_stats({.t = x.dtype(),
                                    .p = acc_of(x.dtype()),
                                    .x = device_address(x),
                                    .mean = device_address(out[0]),
                                    .invstd = device_address(out[1]),
                                    .parts = device_address(parts),
                                    .eps = a.attrs.get_or<double>("eps", 1e-5)},
                                   sh, split, stream_of(a.device));
}

const OpRef kStats = register_op({
    .name = "batch_norm_stats",
    .num_outputs = 2,
    .dtypes = dtype_sets::floating,
    .dtype_rule =
        [](const OpArgs& a) {
          return norm_plan(a, a.inputs[0].dtype(), acc_of(a.inputs[0].dtype()), {{Role::x}},
                           {Role::stats, Role::stats});
        },
    .shape_rule =
        [](const OpArgs& a) {
          const Shape c = check_x(a, a.inputs[0]);
          if (batch_norm_shape(a.inputs[0]).per_channel < 1)
            throw ValueError("[" + a.op.name + "] needs at least one value per channel; got input " +
                             shape_str(a.inputs[0].shape()));
          return std::vector<Shape>{c, c};
        },
    .cpu = stats_cpu,
    .gpu = stats_gpu,
    .test = {.attrs = {Attrs{{"eps", 1e-5}}, Attrs{{"eps", 0.0}}},
             .tolerance_scale = 4,
             .shapes = {{{2, 3, 5, 7}}, {{4, 3}}, {{1, 3, 5, 7}}, {{9, 2, 37, 41}}}},
});

// ---- batch_norm_backward_reduce: g, x, y, mean, invstd -> sums (2, C); attrs relu ----

void reduce_cpu(const OpArgs& a, std::span<Tensor> out) {
  const bool relu = a.attrs.get_or<bool>("relu", false);
  const kernels::BatchNormShape sh = batch_norm_shape(a.inputs[1]);
  const std::int64_t C = sh.channels, S = sh.spatial, N = a.inputs[1].shape()[0];
  const std::vector<double> g = values(a.inputs[0]), x = values(a.inputs[1]);
  const std::vector<double> y = relu ? values(a.inputs[2]) : std::vector<double>();
  const std::vector<double> mean = values(a.inputs[3]), invstd = values(a.inputs[4]);
  std::vector<double> sums(static_cast<std::size_t>(2 * C));
  for (std::int64_t c = 0; c < C; ++c) {
    double sdy = 0, sdx = 0;
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t s = 0; s < S; ++s) {
        const std::size_t i = at(n, c, s, C, S);
        sdy += masked(g, y, relu, i);
        sdx += masked(g, y, relu, i) * (x[i] - mean[c]);
      }
    sums[c] = sdy;
    sums[C + c] = sdx * invstd[c];
  }
  store_values(out[0], sums);
}

void reduce_gpu(const OpArgs& a, std::span<Tensor> out) {
  const bool relu = a.attrs.get_or<bool>("relu", false);
  Tensor in[5];
  for (std::size_t i = 0; i < 5; ++i)
    if (i != 2 || relu) in[i] = gpu::contiguous(a.inputs[i]);
  const kernels::BatchNormShape sh = batch_norm_shape(in[1]);
  const kernels::NormSplit split = kernels::batch_norm_split(sh, a.device.index());
  const Tensor parts = empty({split.scratch}, {.dtype = out[0].dtype(), .device = a.device});
  kernels::launch_batch_norm_backward_reduce({.t = in[1].dtype(),
                                              .p = acc_of(in[1].dtype()),
                                              .g = device_address(in[0]),
                                              .x = device_address(in[1]),
                                              .y = address_or_0(in[2]),
                                              .mean = device_address(in[3]),
                                              .invstd = device_address(in[4]),
                                              .sums = device_address(out[0]),
                                              .parts = device_address(parts),
                                              .relu = relu},
                                             sh, split, stream_of(a.device));
}

// g, x, y, then C-shaped inputs: the shape sets of the tests.
std::vector<std::vector<Shape>> test_shapes(int per_channel_inputs, bool means) {
  std::vector<std::vector<Shape>> sets;
  for (const Shape& x : {Shape{2, 3, 5, 7}, Shape{4, 3}, Shape{1, 3, 5, 7}, Shape{9, 2, 37, 41}}) {
    std::vector<Shape> set(3, x);
    for (int i = 0; i < per_channel_inputs; ++i) set.push_back({x[1]});
    if (means) set.push_back({2, x[1]});
    sets.push_back(set);
  }
  return sets;
}

const OpRef kBackwardReduce = register_op({
    .name = "batch_norm_backward_reduce",
    .num_inputs = 5,
    .dtypes = dtype_sets::floating,
    .dtype_rule =
        [](const OpArgs& a) {
          const DType t = a.inputs[1].dtype();
          const bool relu = a.attrs.get_or<bool>("relu", false);
          return norm_plan(
              a, t, acc_of(t),
              {{Role::x, true, "gradient"}, {Role::x}, {Role::x, relu, "output"}, {Role::stats}, {Role::stats}},
              {Role::stats});
        },
    .shape_rule =
        [](const OpArgs& a) {
          const Shape c = check_x(a, a.inputs[1]);
          check_shape(a, "gradient", a.inputs[0], a.inputs[1].shape());
          if (a.attrs.get_or<bool>("relu", false)) check_shape(a, "output", a.inputs[2], a.inputs[1].shape());
          check_shape(a, "mean", a.inputs[3], c);
          check_shape(a, "invstd", a.inputs[4], c);
          return std::vector<Shape>{{2, c[0]}};
        },
    .cpu = reduce_cpu,
    .gpu = reduce_gpu,
    .test = {.attrs = {Attrs{{"relu", false}}, Attrs{{"relu", true}}},
             .tolerance_scale = 4,
             .shapes = test_shapes(2, false)},
});

// ---- batch_norm_backward_elemt: g, x, y, weight, mean, invstd, means (2, C) -> dx; attrs relu,
// has_weight ----

void elemt_cpu(const OpArgs& a, std::span<Tensor> out) {
  const bool relu = a.attrs.get_or<bool>("relu", false), weight = has(a.attrs, "weight");
  const kernels::BatchNormShape sh = batch_norm_shape(a.inputs[1]);
  const std::int64_t C = sh.channels, S = sh.spatial, N = a.inputs[1].shape()[0];
  const std::vector<double> g = values(a.inputs[0]), x = values(a.inputs[1]);
  const std::vector<double> y = relu ? values(a.inputs[2]) : std::vector<double>();
  const std::vector<double> w = weight ? values(a.inputs[3]) : std::vector<double>(C, 1.0);
  const std::vector<double> mean = values(a.inputs[4]), invstd = values(a.inputs[5]), means = values(a.inputs[6]);
  std::vector<double> dx(x.size());
  for (std::int64_t c = 0; c < C; ++c)
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t s = 0; s < S; ++s) {
        const std::size_t i = at(n, c, s, C, S);
        const double xhat = (x[i] - mean[c]) * invstd[c];
        dx[i] = w[c] * invstd[c] * (masked(g, y, relu, i) - means[c] - xhat * means[C + c]);
      }
  store_values(out[0], dx);
}

void elemt_gpu(const OpArgs& a, std::span<Tensor> out) {
  const bool relu = a.attrs.get_or<bool>("relu", false), weight = has(a.attrs, "weight");
  Tensor in[7];
  for (std::size_t i = 0; i < 7; ++i)
    if ((i != 2 || relu) && (i != 3 || weight)) in[i] = gpu::contiguous(a.inputs[i]);
  // The kernel divides the sums by its count: 1, since `means` are divided already.
  kernels::launch_batch_norm_backward_dx({.t = out[0].dtype(),
                                          .p = weight ? in[3].dtype() : acc_of(out[0].dtype()),
                                          .g = device_address(in[0]),
                                          .x = device_address(in[1]),
                                          .y = address_or_0(in[2]),
                                          .weight = address_or_0(in[3]),
                                          .mean = device_address(in[4]),
                                          .invstd = device_address(in[5]),
                                          .dx = device_address(out[0]),
                                          .sums = device_address(in[6]),
                                          .training = true,
                                          .relu = relu},
                                         batch_norm_shape(in[1]), 1, stream_of(a.device));
}

const OpRef kBackwardElemt = register_op({
    .name = "batch_norm_backward_elemt",
    .num_inputs = 7,
    .dtypes = dtype_sets::floating,
    .dtype_rule =
        [](const OpArgs& a) {
          const DType t = a.inputs[1].dtype();
          const bool relu = a.attrs.get_or<bool>("relu", false), weight = has(a.attrs, "weight");
          const DType p = param_dtype(t, weight ? std::vector<Tensor>{a.inputs[3]} : std::vector<Tensor>{});
          return norm_plan(a, t, p,
                           {{Role::x, true, "gradient"},
                            {Role::x},
                            {Role::x, relu, "output"},
                            {Role::param, weight, "weight"},
                            {Role::stats},
                            {Role::stats},
                            {Role::stats}},
                           {Role::x});
        },
    .shape_rule =
        [](const OpArgs& a) {
          const Shape c = check_x(a, a.inputs[1]);
          check_shape(a, "gradient", a.inputs[0], a.inputs[1].shape());
          if (a.attrs.get_or<bool>("relu", false)) check_shape(a, "output", a.inputs[2], a.inputs[1].shape());
          if (has(a.attrs, "weight")) check_shape(a, "weight", a.inputs[3], c);
          check_shape(a, "mean", a.inputs[4], c);
          check_shape(a, "invstd", a.inputs[5], c);
          check_shape(a, "means", a.inputs[6], {2, c[0]});
          return std::vector<Shape>{a.inputs[1].shape()};
        },
    .cpu = elemt_cpu,
    .gpu = elemt_gpu,
    .test = {.attrs = {Attrs{{"relu", false}, {"has_weight", true}}, Attrs{{"relu", true}, {"has_weight", true}},
                       Attrs{{"relu", false}, {"has_weight", false}}},
             .tolerance_scale = 4,
             .shapes = test_shapes(3, true)},
});

}  // namespace

namespace batch_norm_parts {

std::pair<Tensor, Tensor> stats(const Tensor& x, double eps) {
  const Tensor in[] = {x};
  std::vector<Tensor> r = dispatch(kStats, in, Attrs{{"eps", eps}});
  return {r[0], r[1]};
}

Tensor backward_reduce(const Tensor& g, const Tensor& x, const Tensor& y, const Tensor& mean, const Tensor& invstd,
                       bool relu) {
  const Tensor in[] = {g, x, relu ? y : x, mean, invstd};
  return dispatch(kBackwardReduce, in, Attrs{{"relu", relu}})[0];
}

Tensor backward_elemt(const Tensor& g, const Tensor& x, const Tensor& y, const Tensor& weight, const Tensor& mean,
                      const Tensor& invstd, const Tensor& means, bool relu) {
  const Tensor in[] = {g, x, relu ? y : x, weight.defined() ? weight : x, mean, invstd, means};
  return dispatch(kBackwardElemt, in, Attrs{{"relu", relu}, {"has_weight", weight.defined()}})[0];
}

}  // namespace batch_norm_parts

}  // namespace kiln
