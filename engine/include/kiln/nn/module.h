#pragma once
// Module: a node of a network that owns named parameters and buffers and child modules,
// in registration order. Names are dotted paths, as PyTorch's state dicts write them
// ("0.weight", "features.3.running_mean"), so saved files read the same in both.
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/linalg.h"
#include "kiln/tensor.h"

namespace kiln::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  // Moving keeps the tensors; copying would alias them, so it is not offered.
  Module(Module&&) = default;
  Module& operator=(Module&&) = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }
  // e.g. "Linear(in=784, out=512, bias=true)"; containers print their children indented.
  virtual std::string describe() const = 0;
  // forward with `activation` applied in the module's own kernels, for Sequential to fuse the ReLU
  // that follows it; undefined when the module cannot (the default). Linear and BatchNorm2d fuse
  // without it.
  virtual Tensor forward_fused(const Tensor& x, Activation activation);

  std::vector<Tensor> parameters() const;  // this module's, then each child's, recursively
  NamedTensors named_parameters() const;
  NamedTensors named_buffers() const;  // e.g. batch-norm running statistics
  NamedTensors state() const;          // parameters then buffers: what a checkpoint holds
  std::int64_t parameter_count() const;  // elements over all parameters

  void train(bool on = true);  // recursively
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves parameters and buffers (parameters stay leaves that require grad). Optimizers
  // hold the tensors they were given: build them after moving.
  void to(Device d);
  void zero_grad();  // drops every parameter's .grad()

 protected:
  // Returns the slot for parameter(slot)/buffer(slot); parameters get requires_grad.
  std::size_t add_parameter(std::string name, Tensor t);
  std::size_t add_buffer(std::string name, Tensor t);
  void add_module(std::string name, std::shared_ptr<Module> m);
  // Puts m in child slot `slot` under the same name (e.g. one layer swapped for another kind).
  void replace_module(std::size_t slot, std::shared_ptr<Module> m);
  const Tensor& parameter(std::size_t slot) const { return params_[slot].second; }
  const Tensor& buffer(std::size_t slot) const { return buffers_[slot].second; }
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }

 private:
  NamedTensors params_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

}  // namespace kiln::nn
