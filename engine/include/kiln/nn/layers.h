#pragma once
// Layers with PyTorch's default initialisation: weights Kaiming-uniform with a = sqrt(5)
// (U(-1/sqrt(fan_in), 1/sqrt(fan_in))) and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
// drawn on the CPU in f32 from `gen` (nullptr: the default generator), so one seed gives
// the same weights whatever device the module is later moved to.
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/conv.h"
#include "module.h"
#include "kiln/linalg.h"
#include "kiln/random.h"

namespace kiln::nn {

// y = x @ weight^T + bias; weight (out, in), bias (out).
class Linear : public Module {
 public:
  Linear(std::int64_t in, std::int64_t out, bool bias = true, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  // forward, then the activation, fused into the product where the device allows.
  Tensor forward(const Tensor& x, Activation activation);
  std::string describe() const override;
  const Tensor& weight() const { return parameter(0); }
  const Tensor& bias() const;  // undefined without bias

 private:
  std::int64_t in_, out_;
  bool has_bias_;
};

// weight (out, in/groups, kh, kw), bias (out); fan_in = in/groups * kh * kw.
class Conv2d : public Module {
 public:
  Conv2d(std::int64_t in, std::int64_t out, std::vector<std::int64_t> kernel, Conv2dOptions options = {},
         bool bias = true, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  const Tensor& weight() const { return parameter(0); }
  const Tensor& bias() const;

 private:
  std::int64_t in_, out_;
  std::vector<std::int64_t> kernel_;
  Conv2dOptions options_;
  bool has_bias_;
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(std::vector<std::int64_t> kernel, std::vector<std::int64_t> stride = {},
                     std::vector<std::int64_t> padding = {0});
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  // The (kh, kw) of a pool whose windows tile its input (stride = kernel, no padding), else
  // empty: nn::Sequential then runs a batch norm before it and the pool as one op.
  std::vector<std::int64_t> tiling_kernel() const;

 private:
  std::vector<std::int64_t> kernel_, stride_, padding_;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(std::vector<std::int64_t> kernel, std::vector<std::int64_t> stride = {},
                     std::vector<std::int64_t> padding = {0});
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;

 private:
  std::vector<std::int64_t> kernel_, stride_, padding_;
};

// x (N, C, H, W). Parameters weight = 1, bias = 0 (C); buffers running_mean = 0,
// running_var = 1 (C) and num_batches_tracked (i64 scalar), as PyTorch names them.
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(std::int64_t channels, double eps = 1e-5, double momentum = 0.1);
  Tensor forward(const Tensor& x) override;
  // forward, then the activation, in the same kernel (nn::Sequential uses it for BatchNorm2d then ReLU).
  Tensor forward(const Tensor& x, Activation activation);
  // forward and the activation, then a max pool whose windows tile x (batch_norm_max_pool2d;
  // nn::Sequential uses it on the GPU for BatchNorm2d, ReLU, MaxPool2d).
  Tensor forward(const Tensor& x, Activation activation, std::vector<std::int64_t> pool_kernel);
  std::string describe() const override;
  std::int64_t channels() const { return channels_; }
  double eps() const { return eps_; }
  double momentum() const { return momentum_; }

 private:
  std::int64_t channels_;
  double eps_, momentum_;
};

// Over the trailing dims `shape`; weight = 1, bias = 0 of that shape.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape shape, double eps = 1e-5);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;

 private:
  Shape shape_;
  double eps_;
};

// Identity in eval mode.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;

 private:
  double p_;
  Generator* gen_;
};

// Merges dims start..end into one (defaults: all but the batch dim).
class Flatten : public Module {
 public:
  explicit Flatten(std::int64_t start = 1, std::int64_t end = -1);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;

 private:
  std::int64_t start_, end_;
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::string describe() const override { return "ReLU()"; }
};
class GELU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::string describe() const override { return "GELU()"; }
};
class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::string describe() const override { return "Sigmoid()"; }
};
class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::string describe() const override { return "Tanh()"; }
};

// Runs its children in order; they are named "0", "1", ...
//   Sequential net{Linear(784, 512), ReLU(), Linear(512, 10)};
class Sequential : public Module {
 public:
  Sequential() = default;
  template <class... M>
    requires(sizeof...(M) > 0 && (std::is_base_of_v<Module, std::decay_t<M>> && ...))
  explicit Sequential(M&&... modules) {
    (push_back(std::make_shared<std::decay_t<M>>(std::forward<M>(modules))), ...);
  }
  void push_back(std::shared_ptr<Module> m);
  template <class M>
    requires std::is_base_of_v<Module, std::decay_t<M>>
  void push_back(M&& m) {
    push_back(std::make_shared<std::decay_t<M>>(std::forward<M>(m)));
  }
  std::size_t size() const { return children().size(); }
  Module& operator[](std::size_t i) const;  // ValueError when out of range
  std::shared_ptr<Module> child(std::size_t i) const;
  void replace(std::size_t i, std::shared_ptr<Module> m);  // same name "i"; ValueError when out of range
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
};

}  // namespace kiln::nn
