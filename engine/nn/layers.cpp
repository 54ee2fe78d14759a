// Pooling, normalisation, dropout, flatten and activations: thin modules over the
// functional ops, which also supply the autograd.
#include <sstream>
#include <string>

#include "kiln/autograd.h"
#include "kiln/creation.h"
#include "kiln/elementwise.h"
#include "kiln/nn/layers.h"
#include "kiln/nn_functional.h"
#include "kiln/shape_ops.h"
#include "layer_args.h"

namespace kiln::nn {

namespace {

struct PoolArgs {
  std::vector<std::int64_t> kernel, stride, padding;
};

// Windows over padding must still see input: padding <= kernel / 2, as the ops require.
PoolArgs pool_args(const std::string& layer, const std::vector<std::int64_t>& kernel,
                   const std::vector<std::int64_t>& stride, const std::vector<std::int64_t>& padding) {
  PoolArgs a;
  a.kernel = detail::pair_arg(layer, "kernel", kernel, 1);
  a.stride = stride.empty() ? a.kernel : detail::pair_arg(layer, "stride", stride, 1);
  a.padding = detail::pair_arg(layer, "padding", padding, 0);
  for (int i = 0; i < 2; ++i)
    if (a.padding[i] > a.kernel[i] / 2)
      throw ValueError("[nn." + layer + "] padding " + detail::pair_str(a.padding) + " must be at most half the kernel " +
                       detail::pair_str(a.kernel));
  return a;
}

void check_4d(const char* layer, const Tensor& x) {
  if (x.dim() != 4) throw ShapeError(std::string("[nn.") + layer + "] expected input (N, C, H, W), got " + shape_str(x.shape()));
}

std::string pool_str(const char* name, const std::vector<std::int64_t>& k, const std::vector<std::int64_t>& s,
                     const std::vector<std::int64_t>& p) {
  return std::string(name) + "(kernel=" + detail::pair_str(k) + ", stride=" + detail::pair_str(s) +
         ", padding=" + detail::pair_str(p) + ")";
}

std::string num_str(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

MaxPool2d::MaxPool2d(std::vector<std::int64_t> kernel, std::vector<std::int64_t> stride,
                     std::vector<std::int64_t> padding) {
  PoolArgs a = pool_args("MaxPool2d", kernel, stride, padding);
  kernel_ = std::move(a.kernel), stride_ = std::move(a.stride), padding_ = std::move(a.padding);
}

Tensor MaxPool2d::forward(const Tensor& x) {
  check_4d("MaxPool2d", x);
  return max_pool2d(x, kernel_, stride_, padding_);
}

std::string MaxPool2d::describe() const { return pool_str("MaxPool2d", kernel_, stride_, padding_); }

std::vector<std::int64_t> MaxPool2d::tiling_kernel() const {
  const bool tiles =
      stride_ == kernel_ && std::all_of(padding_.begin(), padding_.end(), [](std::int64_t p) { return p == 0; });
  return tiles ? kernel_ : std::vector<std::int64_t>{};
}

AvgPool2d::AvgPool2d(std::vector<std::int64_t> kernel, std::vector<std::int64_t> stride,
                     std::vector<std::int64_t> padding) {
  PoolArgs a = pool_args("AvgPool2d", kernel, stride, padding);
  kernel_ = std::move(a.kernel), stride_ = std::move(a.stride), padding_ = std::move(a.padding);
}

Tensor AvgPool2d::forward(const Tensor& x) {
  check_4d("AvgPool2d", x);
  return avg_pool2d(x, kernel_, stride_, padding_);
}

std::string AvgPool2d::describe() const { return pool_str("AvgPool2d", kernel_, stride_, padding_); }

BatchNorm2d::BatchNorm2d(std::int64_t channels, double eps, double momentum)
    : channels_(channels), eps_(eps), momentum_(momentum) {
  detail::positive_arg("BatchNorm2d", "channels", channels);
  if (!(eps > 0.0)) throw ValueError("[nn.BatchNorm2d] eps must be positive; got " + num_str(eps));
  if (!(momentum >= 0.0 && momentum <= 1.0))
    throw ValueError("[nn.BatchNorm2d] momentum must be in [0, 1]; got " + num_str(momentum));
  add_parameter("weight", ones({channels}));
  add_parameter("bias", zeros({channels}));
  add_buffer("running_mean", zeros({channels}));
  add_buffer("running_var", ones({channels}));
  add_buffer("num_batches_tracked", scalar_tensor(std::int64_t{0}));
}

Tensor BatchNorm2d::forward(const Tensor& x) { return forward(x, Activation::none); }

Tensor BatchNorm2d::forward(const Tensor& x, Activation activation) { return forward(x, activation, {}); }

Tensor BatchNorm2d::forward(const Tensor& x, Activation activation, std::vector<std::int64_t> pool_kernel) {
  if (x.dim() != 4 || x.size(1) != channels_)
    throw ShapeError("[nn.BatchNorm2d] expected input (N, " + std::to_string(channels_) + ", H, W), got " +
                     shape_str(x.shape()));
  // Both update the running statistics and count the batch in place when training.
  return pool_kernel.empty() ? batch_norm(x, buffer(0), buffer(1), parameter(0), parameter(1), is_training(), momentum_,
                                          eps_, activation, buffer(2))
                             : batch_norm_max_pool2d(x, buffer(0), buffer(1), parameter(0), parameter(1), is_training(),
                                                     momentum_, eps_, activation, pool_kernel, buffer(2));
}

std::string BatchNorm2d::describe() const {
  return "BatchNorm2d(" + std::to_string(channels_) + ", eps=" + num_str(eps_) + ", momentum=" + num_str(momentum_) +
         ")";
}

LayerNorm::LayerNorm(Shape shape, double eps) : shape_(std::move(shape)), eps_(eps) {
  if (shape_.empty()) throw ValueError("[nn.LayerNorm] normalized shape must not be empty");
  for (std::int64_t s : shape_) detail::positive_arg("LayerNorm", "normalized shape", s);
  if (!(eps > 0.0)) throw ValueError("[nn.LayerNorm] eps must be positive; got " + num_str(eps));
  add_parameter("weight", ones(shape_));
  add_parameter("bias", zeros(shape_));
}

Tensor LayerNorm::forward(const Tensor& x) {
  const std::size_t k = shape_.size();
  const bool ok = static_cast<std::size_t>(x.dim()) >= k && Shape(x.shape().end() - k, x.shape().end()) == shape_;
  if (!ok) {
    std::string want = "(...";
    for (std::int64_t s : shape_) want += ", " + std::to_string(s);
    throw ShapeError("[nn.LayerNorm] expected input " + want + "), got " + shape_str(x.shape()));
  }
  return layer_norm(x, shape_, parameter(0), parameter(1), eps_);
}

std::string LayerNorm::describe() const { return "LayerNorm(" + shape_str(shape_) + ", eps=" + num_str(eps_) + ")"; }

Dropout::Dropout(double p, Generator* gen) : p_(p), gen_(gen) {
  if (!(p >= 0.0 && p < 1.0)) throw ValueError("[nn.Dropout] p must be in [0, 1); got " + num_str(p));
}

Tensor Dropout::forward(const Tensor& x) { return dropout(x, p_, is_training(), gen_); }

std::string Dropout::describe() const { return "Dropout(p=" + num_str(p_) + ")"; }

Flatten::Flatten(std::int64_t start, std::int64_t end) : start_(start), end_(end) {}

Tensor Flatten::forward(const Tensor& x) { return flatten(x, start_, end_); }

std::string Flatten::describe() const {
  return "Flatten(start=" + std::to_string(start_) + ", end=" + std::to_string(end_) + ")";
}

Tensor ReLU::forward(const Tensor& x) { return relu(x); }
Tensor GELU::forward(const Tensor& x) { return gelu(x); }
Tensor Sigmoid::forward(const Tensor& x) { return sigmoid(x); }
Tensor Tanh::forward(const Tensor& x) { return tanh(x); }

}  // namespace kiln::nn
