#include "copy.h"

#include <cmath>
#include <sstream>

#include "core/cpu/loops.h"
#include "dispatch.h"
#include "kiln/runtime/memory.h"
#include "tensor_impl.h"

namespace kiln {

void copy_into(const Tensor& src, const Tensor& dst) {
  if (src.device() != dst.device())
    throw DeviceError("[copy] tensors on " + src.device().str() + " and " + dst.device().str());
  if (broadcast_shapes(src.shape(), dst.shape(), "copy") != dst.shape())
    throw ShapeError("[copy] cannot copy shape " + shape_str(src.shape()) + " into shape " + shape_str(dst.shape()));
  if (dst.numel() == 0) return;
  if (dst.device().is_cuda()) {
    gpu::copy(src, dst);
    return;
  }
  cpu::visit(src.dtype(), [&]<class S>() {
    cpu::visit(dst.dtype(), [&]<class D>() { cpu::map_unary<S, D>(src, dst, [](auto x) { return x; }); });
  });
}

void check_fits(const Scalar& value, DType dtype, std::string_view op) {
  if (dtype == DType::boolean || dtype == DType::f64 || value.is_bool()) return;
  const double v = value.to_double();
  double lo = 0, hi = 0;
  switch (dtype) {
    case DType::u8: hi = 255; break;
    case DType::i32: lo = -2147483648.0, hi = 2147483647.0; break;
    case DType::i64: lo = -9223372036854775808.0, hi = 9223372036854775807.0; break;
    case DType::f16: hi = 65504.0; break;
    case DType::bf16: hi = 3.3895313892515355e38; break;
    default: hi = 3.4028234663852886e38; break;  // f32
  }
  bool fits;
  if (is_floating(dtype)) fits = !std::isfinite(v) || std::abs(v) <= hi;
  else if (value.is_integer()) fits = dtype == DType::i64 || (v >= lo && v <= hi);
  else fits = std::isfinite(v) && std::trunc(v) >= lo && (dtype == DType::i64 ? std::trunc(v) < hi : std::trunc(v) <= hi);
  if (!fits) {
    std::ostringstream text;
    text << "[" << op << "] the value " << v << " does not fit dtype " << dtype_name(dtype);
    throw ValueError(text.str());
  }
}

void fill_into(const Tensor& dst, const Scalar& value) {
  if (dst.numel() == 0) return;
  if (dst.device().is_cuda()) {
    gpu::fill(dst, value);
    return;
  }
  cpu::visit(dst.dtype(), [&]<class T>() {
    T v;
    if constexpr (std::is_same_v<T, bool>) v = value.to_bool();
    else if constexpr (std::is_integral_v<T>) v = value.is_floating() ? cpu::store<T>(value.to_double()) : static_cast<T>(value.to_int());
    else v = cpu::store<T>(value.to_double());
    T* p = cpu::ptr<T>(dst);
    cpu::for_each_offset<1>(dst.shape(), {&dst.strides()}, {0}, [&](const std::array<std::int64_t, 1>& o) { p[o[0]] = v; });
  });
}

Tensor convert(const Tensor& t, DType dtype) {
  Tensor out(make_impl(t.shape(), dtype, t.device()));
  copy_into(t, out);
  return out;
}

Tensor host_contiguous(const Tensor& t) {
  if (t.device().is_cuda()) step::require_host("to_host", "copying a tensor to the host");
  if (t.device().is_cpu()) return t.is_contiguous() ? t : convert(t, t.dtype());
  Tensor dev = t.is_contiguous() ? t : convert(t, t.dtype());
  Tensor host(make_impl(t.shape(), t.dtype(), Device::cpu()));
  const std::size_t bytes = static_cast<std::size_t>(t.numel()) * t.element_size();
  if (bytes) rt::copy_to_host(host.data_ptr(), device_address(dev), bytes, stream_of(t.device()));
  return host;
}

Tensor filled(const Shape& shape, const Scalar& value, DType dtype, Device device) {
  Tensor t(make_impl(shape, dtype, device));
  fill_into(t, value);
  return t;
}

Tensor empty(const Shape& shape, TensorOptions o) {
  Tensor t(make_impl(shape, o.dtype.value_or(DType::f32), o.device));
  if (o.requires_grad) t.requires_grad_();
  return t;
}

}  // namespace kiln
