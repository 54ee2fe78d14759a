// layer_norm and batch_norm as composites of sums, rsqrt and arithmetic (autograd from
// the parts). f16/bf16 inputs are normalised in f32 and cast back. Running statistics
// update in place on their device.
#include <algorithm>
#include <string>

#include "kiln/elementwise.h"
#include "kiln/nn_functional.h"
#include "registry.h"

namespace kiln {

namespace {

bool is_half(DType t) { return t == DType::f16 || t == DType::bf16; }
Tensor in_f32(const Tensor& t) { return t.defined() && is_half(t.dtype()) ? cast(t, DType::f32) : t; }

void check_floating(const char* op, const char* what, const Tensor& t) {
  if (t.defined() && !is_floating(t.dtype()))
    throw DTypeError(std::string("[") + op + "] " + what + " must be floating; got " +
                     std::string(dtype_name(t.dtype())));
}

void check_param(const char* op, const char* what, const Tensor& t, const Shape& expect) {
  if (!t.defined()) return;
  check_floating(op, what, t);
  if (t.shape() != expect)
    throw ShapeError(std::string("[") + op + "] " + what + " has shape " + shape_str(t.shape()) + "; expected " +
                     shape_str(expect));
}

// (x - mean) / sqrt(var + eps) over `axes`, biased variance; returns mean and variance too.
struct Normalized {
  Tensor y, mean, var;
};
Normalized normalize(const Tensor& x, const std::vector<std::int64_t>& axes, std::int64_t count, double eps) {
  const Tensor mean = div(sum(x, axes, true), static_cast<double>(count));
  const Tensor xc = sub(x, mean);
  const Tensor var = div(sum(mul(xc, xc), axes, true), static_cast<double>(count));
  return {mul(xc, rsqrt(add(var, eps))), mean, var};
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  check_floating("layer_norm", "input", x);
  const int k = static_cast<int>(normalized_shape.size()), nd = x.dim();
  if (k == 0 || k > nd || !std::equal(normalized_shape.begin(), normalized_shape.end(), x.shape().end() - k))
    throw ShapeError("[layer_norm] normalized_shape " + shape_str(normalized_shape) +
                     " must be the trailing dims of the input " + shape_str(x.shape()));
  check_param("layer_norm", "weight", weight, normalized_shape);
  check_param("layer_norm", "bias", bias, normalized_shape);
  std::vector<std::int64_t> axes;
  for (int d = nd - k; d < nd; ++d) axes.push_back(d);
  Tensor y = normalize(in_f32(x), axes, shape_numel(normalized_shape), eps).y;
  if (weight.defined()) y = mul(y, in_f32(weight));
  if (bias.defined()) y = add(y, in_f32(bias));
  return y.dtype() == x.dtype() || !is_half(x.dtype()) ? y : cast(y, x.dtype());
}

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps) {
  check_floating("batch_norm", "input", x);
  if (x.dim() < 2) throw ShapeError("[batch_norm] input must be (N, C) or (N, C, d...); got " + shape_str(x.shape()));
  const std::int64_t channels = x.shape()[1];
  for (const auto& [what, t] : {std::pair{"running_mean", running_mean}, std::pair{"running_var", running_var},
                                std::pair{"weight", weight}, std::pair{"bias", bias}})
    check_param("batch_norm", what, t, Shape{channels});
  if (!training && !(running_mean.defined() && running_var.defined()))
    throw ValueError("[batch_norm] eval mode needs running_mean and running_var");
  // Per-channel tensors broadcast as (1, C, 1...).
  Shape stat_shape(static_cast<std::size_t>(x.dim()), 1);
  stat_shape[1] = channels;
  auto channel = [&](const Tensor& t) { return reshape(in_f32(t), stat_shape); };
  const Tensor xf = in_f32(x);
  Tensor y;
  if (training) {
    std::vector<std::int64_t> axes{0};
    for (int d = 2; d < x.dim(); ++d) axes.push_back(d);
    const std::int64_t count = x.numel() / std::max<std::int64_t>(channels, 1);
    if (count <= 1)
      throw ValueError("[batch_norm] training needs more than one value per channel; got input " +
                       shape_str(x.shape()));
    Normalized n = normalize(xf, axes, count, eps);
    y = n.y;
    if (running_mean.defined() || running_var.defined()) {
      NoGradGuard no_grad;
      const double unbias = static_cast<double>(count) / static_cast<double>(count - 1);
      Tensor rm = running_mean, rv = running_var;
      if (rm.defined()) rm.mul_(1.0 - momentum).add_(mul(reshape(n.mean.detach(), {channels}), momentum));
      if (rv.defined()) rv.mul_(1.0 - momentum).add_(mul(reshape(n.var.detach(), {channels}), momentum * unbias));
    }
  } else {
    y = mul(sub(xf, channel(running_mean)), rsqrt(add(channel(running_var), eps)));
  }
  if (weight.defined()) y = mul(y, channel(weight));
  if (bias.defined()) y = add(y, channel(bias));
  return y.dtype() == x.dtype() || !is_half(x.dtype()) ? y : cast(y, x.dtype());
}

}  // namespace kiln
