// Linear and Conv2d: PyTorch's default initialisation drawn on the CPU from a Philox
// generator, and forwards through the functional ops (autograd comes from them).
#include <cmath>
#include <string>

#include "kiln/autograd.h"
#include "kiln/linalg.h"
#include "kiln/nn/layers.h"
#include "kiln/ops.h"
#include "layer_args.h"

namespace kiln::nn {

namespace {

// U(-bound, bound) in f32 as rand * 2b - b. kaiming_uniform(a = sqrt(5)) reduces to
// bound = gain * sqrt(3 / fan_in) with gain = sqrt(2 / (1 + 5)), i.e. 1 / sqrt(fan_in).
Tensor uniform(const Shape& shape, double bound, Generator* gen) {
  NoGradGuard no_grad;
  return sub(mul(rand(shape, {.dtype = DType::f32}, gen), 2.0 * bound), bound);
}

const Tensor& undefined_tensor() {
  static const Tensor none;
  return none;
}

}  // namespace

Linear::Linear(std::int64_t in, std::int64_t out, bool bias, Generator* gen) : in_(in), out_(out), has_bias_(bias) {
  detail::positive_arg("Linear", "in", in);
  detail::positive_arg("Linear", "out", out);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  add_parameter("weight", uniform({out, in}, bound, gen));
  if (bias) add_parameter("bias", uniform({out}, bound, gen));
}

const Tensor& Linear::bias() const { return has_bias_ ? parameter(1) : undefined_tensor(); }

Tensor Linear::forward(const Tensor& x) { return forward(x, Activation::none); }

Tensor Linear::forward(const Tensor& x, Activation activation) {
  if (x.dim() < 1 || x.size(-1) != in_)
    throw ShapeError("[nn.Linear] expected input (..., " + std::to_string(in_) + "), got " + shape_str(x.shape()));
  return linear(x, weight(), bias(), activation);
}

std::string Linear::describe() const {
  return "Linear(in=" + std::to_string(in_) + ", out=" + std::to_string(out_) +
         ", bias=" + detail::bool_str(has_bias_) + ")";
}

Conv2d::Conv2d(std::int64_t in, std::int64_t out, std::vector<std::int64_t> kernel, Conv2dOptions options, bool bias,
               Generator* gen)
    : in_(in), out_(out), has_bias_(bias) {
  detail::positive_arg("Conv2d", "in", in);
  detail::positive_arg("Conv2d", "out", out);
  detail::positive_arg("Conv2d", "groups", options.groups);
  if (in % options.groups != 0 || out % options.groups != 0)
    throw ValueError("[nn.Conv2d] in (" + std::to_string(in) + ") and out (" + std::to_string(out) +
                     ") must be divisible by groups (" + std::to_string(options.groups) + ")");
  kernel_ = detail::pair_arg("Conv2d", "kernel", kernel, 1);
  options_.stride = detail::pair_arg("Conv2d", "stride", options.stride, 1);
  options_.padding = detail::pair_arg("Conv2d", "padding", options.padding, 0);
  options_.dilation = detail::pair_arg("Conv2d", "dilation", options.dilation, 1);
  options_.groups = options.groups;
  const std::int64_t fan_in = in / options.groups * kernel_[0] * kernel_[1];
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  add_parameter("weight", uniform({out, in / options.groups, kernel_[0], kernel_[1]}, bound, gen));
  if (bias) add_parameter("bias", uniform({out}, bound, gen));
}

const Tensor& Conv2d::bias() const { return has_bias_ ? parameter(1) : undefined_tensor(); }

Tensor Conv2d::forward(const Tensor& x) {
  if (x.dim() != 4 || x.size(1) != in_)
    throw ShapeError("[nn.Conv2d] expected input (N, " + std::to_string(in_) + ", H, W), got " +
                     shape_str(x.shape()));
  return conv2d(x, weight(), bias(), options_);
}

std::string Conv2d::describe() const {
  std::string s = "Conv2d(in=" + std::to_string(in_) + ", out=" + std::to_string(out_) +
                  ", kernel=" + detail::pair_str(kernel_) + ", stride=" + detail::pair_str(options_.stride) +
                  ", padding=" + detail::pair_str(options_.padding);
  if (options_.dilation != std::vector<std::int64_t>{1, 1}) s += ", dilation=" + detail::pair_str(options_.dilation);
  if (options_.groups != 1) s += ", groups=" + std::to_string(options_.groups);
  return s + ", bias=" + detail::bool_str(has_bias_) + ")";
}

}  // namespace kiln::nn
