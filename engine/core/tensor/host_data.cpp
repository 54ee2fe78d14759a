// Moving values between host containers and tensors: item, to_vector, from_data, from_vector.
#include <cstring>

#include "copy.h"
#include "core/cpu/loops.h"
#include "dispatch.h"
#include "kiln/creation.h"
#include "kiln/runtime/memory.h"
#include "tensor_impl.h"

namespace kiln {

namespace {
template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::f32;
  else if constexpr (std::is_same_v<T, double>) return DType::f64;
  else if constexpr (std::is_same_v<T, Half>) return DType::f16;
  else if constexpr (std::is_same_v<T, BFloat16>) return DType::bf16;
  else if constexpr (std::is_same_v<T, std::int32_t>) return DType::i32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return DType::i64;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return DType::u8;
  else return DType::boolean;
}
}  // namespace

template <class T>
std::vector<T> Tensor::to_vector() const {
  if (device().is_cuda()) step::require_host("to_vector", "reading a tensor's values");
  Tensor host = host_contiguous(*this);
  std::vector<T> out(static_cast<std::size_t>(host.numel()));
  cpu::visit(host.dtype(), [&]<class S>() {
    const S* p = cpu::ptr<const S>(host);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = cpu::store<T>(cpu::load(p[i]));
  });
  return out;
}

template <class T>
T Tensor::item() const {
  if (device().is_cuda()) step::require_host("item", "reading a tensor's value");
  if (numel() != 1)
    throw ShapeError("[item] needs a tensor with one element, not one of shape " + shape_str(shape()));
  return to_vector<T>()[0];
}

#define KILN_INSTANTIATE(T)                   \
  template T Tensor::item<T>() const;         \
  template std::vector<T> Tensor::to_vector<T>() const;
KILN_TENSOR_ELEMENT_TYPES(KILN_INSTANTIATE)
#undef KILN_INSTANTIATE

Tensor from_data(const void* data, const Shape& shape, DType dtype, Device device) {
  if (device.is_cuda()) step::require_host("from_data", "making a tensor from host data");
  Tensor out(make_impl(shape, dtype, device));
  const std::size_t bytes = static_cast<std::size_t>(out.numel()) * dtype_size(dtype);
  if (bytes == 0) return out;
  if (device.is_cpu()) std::memcpy(out.data_ptr(), data, bytes);
  else rt::copy_to_device(device_address(out), data, bytes, stream_of(device));
  return out;
}

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions options) {
  if (static_cast<std::int64_t>(values.size()) != shape_numel(shape))
    throw ShapeError("[from_vector] " + std::to_string(values.size()) + " values cannot fill shape " + shape_str(shape));
  const DType dtype = options.dtype.value_or(dtype_of<T>());
  Tensor host(make_impl(shape, dtype, Device::cpu()));
  cpu::visit(dtype, [&]<class D>() {
    D* p = cpu::ptr<D>(host);
    for (std::size_t i = 0; i < values.size(); ++i) p[i] = cpu::store<D>(cpu::load(static_cast<T>(values[i])));
  });
  Tensor out = options.device.is_cpu() ? host : from_data(host.data_ptr(), shape, dtype, options.device);
  if (options.requires_grad) out.requires_grad_();
  return out;
}

#define KILN_INSTANTIATE(T)                                                                 \
  template Tensor from_vector<T>(const std::vector<T>&, const Shape&, TensorOptions);
KILN_TENSOR_ELEMENT_TYPES(KILN_INSTANTIATE)
KILN_INSTANTIATE(Half)
KILN_INSTANTIATE(BFloat16)
#undef KILN_INSTANTIATE

}  // namespace kiln
