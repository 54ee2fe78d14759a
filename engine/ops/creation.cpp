// Creation ops: full (zeros, ones), arange, linspace, eye. They take no tensor inputs;
// attrs carry the shape, dtype and device. GPU: full and eye run the fill kernel;
// arange and linspace compute their (small) values on the host and copy them over.
#include <cmath>

#include "core/dtype_sets.h"
#include "core/registry.h"
#include "core/tensor/copy.h"
#include "core/tensor/tensor_impl.h"

namespace kiln {

namespace {


using rules::dtype_from_attrs;
using rules::shape_from_attrs;

// Fills a contiguous tensor from host-computed values, on either device.
template <class F>
void fill_from_host(const Tensor& out, F value_at) {
  Tensor host = out.device().is_cpu() ? out : empty(out.shape(), {.dtype = out.dtype()});
  cpu::visit(out.dtype(), [&]<class T>() {
    T* p = cpu::ptr<T>(host);
    for (std::int64_t i = 0; i < host.numel(); ++i) p[i] = value_at.template operator()<T>(i);
  });
  if (!out.is_same(host)) copy_into(host.to(out.device()), out);
}

void fill_value(const OpArgs& a, std::span<Tensor> out) {
  const Scalar& value = a.attrs.get<Scalar>("value");
  check_fits(value, out[0].dtype(), "full");
  fill_into(out[0], value);
}

const OpRef kFull = register_op({
    .name = "full",
    .num_inputs = 0,
    .dtypes = dtype_sets::all,
    .dtype_rule = dtype_from_attrs,
    .shape_rule = shape_from_attrs,
    .cpu = fill_value,
    .gpu = fill_value,
    .test = {.attrs = {Attrs{{"shape", std::vector<std::int64_t>{5, 7}}, {"value", Scalar(1.5)}, {"dtype", DType::f32}}}},
});

// Element i is start + i * step: exact in i64 for integer dtypes, in f64 otherwise.
void arange_impl(const OpArgs& a, std::span<Tensor> out) {
  const Scalar start = a.attrs.get<Scalar>("start"), step = a.attrs.get<Scalar>("step");
  fill_from_host(out[0], [&]<class T>(std::int64_t i) {
    if (!start.is_floating() && !step.is_floating()) return cpu::store<T>(start.to_int() + i * step.to_int());
    return cpu::store<T>(start.to_double() + static_cast<double>(i) * step.to_double());
  });
}

const OpRef kArange = register_op({
    .name = "arange",
    .num_inputs = 0,
    .dtypes = dtype_sets::numeric,
    .dtype_rule = dtype_from_attrs,
    .shape_rule = shape_from_attrs,
    .cpu = arange_impl,
    .gpu = arange_impl,
    .test = {.attrs = {Attrs{{"shape", std::vector<std::int64_t>{11}}, {"start", Scalar(-3)}, {"step", Scalar(2)},
                             {"dtype", DType::i64}}}},
});

// PyTorch's formula: the first half steps up from start, the second half down from end,
// so both endpoints are exact.
void linspace_impl(const OpArgs& a, std::span<Tensor> out) {
  const double start = a.attrs.get<double>("start"), end = a.attrs.get<double>("end");
  const std::int64_t n = out[0].numel();
  const double step = n > 1 ? (end - start) / static_cast<double>(n - 1) : 0.0;
  fill_from_host(out[0], [&]<class T>(std::int64_t i) {
    if (n == 1) return cpu::store<T>(start);
    double v = i < n / 2 ? start + step * static_cast<double>(i) : end - step * static_cast<double>(n - 1 - i);
    return cpu::store<T>(v);
  });
}

const OpRef kLinspace = register_op({
    .name = "linspace",
    .num_inputs = 0,
    .dtypes = dtype_sets::floating,
    .dtype_rule = dtype_from_attrs,
    .shape_rule = shape_from_attrs,
    .cpu = linspace_impl,
    .gpu = linspace_impl,
    .test = {.attrs = {Attrs{{"shape", std::vector<std::int64_t>{13}}, {"start", -1.0}, {"end", 2.0},
                             {"dtype", DType::f32}}}},
});

// Zeros, then ones along the diagonal view (stride m + 1).
void eye_impl(const OpArgs&, std::span<Tensor> out) {
  const Tensor& t = out[0];
  fill_into(t, 0);
  const std::int64_t n = t.shape()[0], m = t.shape()[1];
  fill_into(make_view(t, {std::min(n, m)}, {m + 1}, 0), 1);
}

const OpRef kEye = register_op({
    .name = "eye",
    .num_inputs = 0,
    .dtypes = dtype_sets::all,
    .dtype_rule = dtype_from_attrs,
    .shape_rule = shape_from_attrs,
    .cpu = eye_impl,
    .gpu = eye_impl,
    .test = {.attrs = {Attrs{{"shape", std::vector<std::int64_t>{5, 7}}, {"dtype", DType::f32}}}},
});

Attrs creation_attrs(const Shape& shape, DType dtype, Device device) {
  return Attrs{{"shape", std::vector<std::int64_t>(shape)}, {"dtype", dtype}, {"device", device}};
}


}  // namespace

Tensor full(const Shape& shape, const Scalar& value, TensorOptions o) {
  Attrs attrs = creation_attrs(shape, o.dtype.value_or(value.default_dtype()), o.device);
  attrs.set("value", value);
  return with_grad_option(call(kFull, {}, attrs), o);
}

Tensor zeros(const Shape& shape, TensorOptions o) {
  if (!o.dtype) o.dtype = DType::f32;
  return full(shape, 0, o);
}

Tensor ones(const Shape& shape, TensorOptions o) {
  if (!o.dtype) o.dtype = DType::f32;
  return full(shape, 1, o);
}

Tensor scalar_tensor(const Scalar& value, TensorOptions o) { return full({}, value, o); }

Tensor empty_like(const Tensor& t) { return empty(t.shape(), {.dtype = t.dtype(), .device = t.device()}); }
Tensor zeros_like(const Tensor& t) { return full(t.shape(), 0, {.dtype = t.dtype(), .device = t.device()}); }
Tensor ones_like(const Tensor& t) { return full(t.shape(), 1, {.dtype = t.dtype(), .device = t.device()}); }
Tensor full_like(const Tensor& t, const Scalar& value) {
  return full(t.shape(), value, {.dtype = t.dtype(), .device = t.device()});
}

Tensor arange(const Scalar& end, TensorOptions o) { return arange(0, end, 1, o); }

Tensor arange(const Scalar& start, const Scalar& end, const Scalar& step, TensorOptions o) {
  const double s = start.to_double(), e = end.to_double(), d = step.to_double();
  if (d == 0 || !std::isfinite(s) || !std::isfinite(e) || !std::isfinite(d))
    throw ValueError("[arange] start, end and step must be finite and step nonzero");
  if ((e - s) * d < 0)
    throw ValueError("[arange] step " + step.str() + " cannot go from " + start.str() + " to " + end.str());
  const bool integral = !start.is_floating() && !end.is_floating() && !step.is_floating();
  std::int64_t n;
  if (integral) {
    const std::int64_t span = end.to_int() - start.to_int(), st = step.to_int();
    n = span / st + (span % st != 0);
  } else {
    n = static_cast<std::int64_t>(std::ceil((e - s) / d));
  }
  const DType dtype = o.dtype.value_or(integral ? DType::i64 : DType::f32);
  Attrs attrs = creation_attrs({n}, dtype, o.device);
  attrs.set("start", start).set("step", step);
  return with_grad_option(call(kArange, {}, attrs), o);
}

Tensor linspace(double start, double end, std::int64_t steps, TensorOptions o) {
  if (steps < 0) throw ValueError("[linspace] steps must be non-negative, got " + std::to_string(steps));
  Attrs attrs = creation_attrs({steps}, o.dtype.value_or(DType::f32), o.device);
  attrs.set("start", start).set("end", end);
  return with_grad_option(call(kLinspace, {}, attrs), o);
}

Tensor eye(std::int64_t n, TensorOptions o) { return eye(n, n, o); }

Tensor eye(std::int64_t n, std::int64_t m, TensorOptions o) {
  if (n < 0 || m < 0) throw ShapeError("[eye] sizes must be non-negative, got " + std::to_string(n) + " and " + std::to_string(m));
  return with_grad_option(call(kEye, {}, creation_attrs({n, m}, o.dtype.value_or(DType::f32), o.device)), o);
}

}  // namespace kiln
