#pragma once
// Tensor: a cheap shared handle to dtype, shape, strides, offset and a storage that
// views share. Copies of a Tensor are the same tensor; clone() copies the data.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "device.h"
#include "kiln/dtype.h"
#include "scalar.h"

namespace kiln {

using Shape = std::vector<std::int64_t>;  // also used for strides, in elements

struct TensorImpl;
class Node;
struct BackwardOptions;

// Options of the creation functions, e.g. zeros({2, 3}, {.dtype = DType::f64, .device = dev}).
struct TensorOptions {
  std::optional<DType> dtype;  // absent: the function's default (f32, or i64 for integer arange/randint)
  Device device = Device::cpu();
  bool requires_grad = false;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl);

  bool defined() const { return impl_ != nullptr; }
  DType dtype() const;
  const Shape& shape() const;
  const Shape& strides() const;
  std::int64_t offset() const;  // storage offset, in elements
  int dim() const;
  std::int64_t numel() const;
  std::int64_t size(int axis) const;  // negative axes count from the end
  std::size_t element_size() const;
  Device device() const;
  bool is_contiguous() const;  // row-major with no gaps
  // Address of the first element: a host pointer on cpu, the device address on cuda.
  void* data_ptr() const;

  // Explicit transfers and conversions; the same device/dtype returns *this (no copy).
  Tensor to(Device d) const;
  Tensor to(DType t) const;
  Tensor contiguous() const;  // *this when already contiguous
  Tensor clone() const;       // a contiguous copy, recorded by autograd
  Tensor detach() const;      // shares storage, outside the graph

  // Synchronise with the tensor's device. item() needs exactly one element.
  // T is one of float, double, std::int32_t, std::int64_t, std::uint8_t, bool.
  template <class T>
  T item() const;
  template <class T>
  std::vector<T> to_vector() const;  // row-major, converted to T

  Tensor reshape(Shape shape) const;  // a view when the strides allow, else a copy
  Tensor view(Shape shape) const;     // a view or ShapeError; -1 infers one size

  // Autograd.
  bool requires_grad() const;
  Tensor& requires_grad_(bool on = true);  // leaves of a floating dtype only
  bool is_leaf() const;                    // not produced by a recorded op
  const Tensor& grad() const;              // undefined until a backward reaches this leaf
  void set_grad(const Tensor& g);
  void zero_grad();  // drops .grad()
  // On a leaf that requires grad: `hook(leaf)` runs in each backward once this leaf's gradient
  // for it is complete (every path to it accumulated), before the backward goes on, e.g. to
  // start its all-reduce while earlier layers still differentiate. Not run when no gradient
  // reached the leaf. ValueError on a non-leaf or a tensor without requires_grad.
  void add_grad_ready_hook(std::function<void(const Tensor& leaf)> hook);
  void clear_grad_ready_hooks();
  std::shared_ptr<Node> grad_fn() const;
  void backward() const;  // on a one-element tensor
  void backward(const Tensor& gradient, bool retain_graph = false) const;
  void backward(const BackwardOptions& options) const;

  // In place; each bumps the storage's version counter, which autograd checks.
  Tensor& add_(const Tensor& o);
  Tensor& add_(const Scalar& s);
  Tensor& sub_(const Tensor& o);
  Tensor& sub_(const Scalar& s);
  Tensor& mul_(const Tensor& o);
  Tensor& mul_(const Scalar& s);
  Tensor& div_(const Tensor& o);
  Tensor& div_(const Scalar& s);
  Tensor& fill_(const Scalar& s);
  Tensor& zero_();
  Tensor& copy_(const Tensor& src);  // broadcasts src, converts dtype, may cross devices
  std::uint64_t version() const;

  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }
  bool shares_storage(const Tensor& o) const;
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

struct BackwardOptions {
  Tensor gradient;  // undefined: ones, for a one-element tensor
  bool retain_graph = false;
};

#define KILN_TENSOR_ELEMENT_TYPES(X) X(float) X(double) X(std::int32_t) X(std::int64_t) X(std::uint8_t) X(bool)
#define KILN_DECLARE_EXTERN(T)                              \
  extern template T Tensor::item<T>() const;                \
  extern template std::vector<T> Tensor::to_vector<T>() const;
KILN_TENSOR_ELEMENT_TYPES(KILN_DECLARE_EXTERN)
#undef KILN_DECLARE_EXTERN

// "(3,4)" as error messages write shapes.
std::string shape_str(const Shape& s);
std::int64_t shape_numel(const Shape& s);
Shape contiguous_strides(const Shape& s);

// Prints dtype, device, shape and values; tensors over 1000 elements show the first
// and last 3 entries of each dimension, as PyTorch does.
std::ostream& operator<<(std::ostream& os, const Tensor& t);
std::string to_string(const Tensor& t);

}  // namespace kiln
