#pragma once
// Shared pieces of the elementwise op files (elementwise_unary.cpp, elementwise_binary.cpp,
// compare.cpp, activation.cpp, arithmetic.cpp): the kernels' compute types on the
// host, scalar conversion, and OpDef builders for "one device expression, one CPU lambda" ops.
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu_fast.h"
#include "kiln/autograd.h"
#include "kiln/creation.h"
#include "kiln/elementwise.h"
#include "core/dtype_sets.h"
#include "core/registry.h"

namespace kiln::elementwise_defs {

using kernels::PointwiseDomain;

// The type a kernel computes in for storage type T (runtime/src/dtype.cpp: u8 computes in
// unsigned int), so the CPU reference sees the same scalar conversions and wraps.
template <class T> struct KernelCompute { using type = cpu::compute_t<T>; };
template <> struct KernelCompute<std::uint8_t> { using type = std::uint32_t; };
template <class T> using kc_t = typename KernelCompute<T>::type;

// The kernels' from_scalar: exact integers for integer compute types, else the double.
template <class C>
C scalar_as(const Scalar& s) {
  if constexpr (std::is_same_v<C, bool>) return s.to_double() != 0.0;
  else if constexpr (std::is_integral_v<C>) return static_cast<C>(s.to_int());
  else return static_cast<C>(s.to_double());
}

inline kernels::Scalar kernel_scalar(const Scalar& s) {
  return s.is_floating() ? kernels::Scalar(s.to_double()) : kernels::Scalar(s.to_int());
}

inline Attrs scalar_attrs(const Scalar& s) { return Attrs{{"scalar", s}}; }
inline Scalar scalar_of(const VjpContext& c) { return c.attrs().get<Scalar>("scalar"); }

// Calls f.template operator()<T>() for the storage type of t, f16 and bf16 excepted (they
// reach the loops as f32, below); FloatOnly instantiates only the floating types (ops whose
// kernels are floating only), to keep builds small.
template <bool FloatOnly, class F>
void visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    default: break;
  }
  if constexpr (!FloatOnly) {
    switch (t) {
      case DType::i32: return f.template operator()<std::int32_t>();
      case DType::i64: return f.template operator()<std::int64_t>();
      case DType::u8: return f.template operator()<std::uint8_t>();
      case DType::boolean: return f.template operator()<bool>();
      default: break;
    }
  }
  throw DTypeError("[cpu] no elementwise loop for dtype " + std::string(dtype_name(t)));
}

template <class T, bool ToBool> using out_t = std::conditional_t<ToBool, bool, T>;

// f16/bf16 compute in f32 and round once, so their loops are the f32 loops on widened copies,
// bit for bit the same, with two loops fewer per op to compile. `run(o)` writes the result to o:
// out itself, or for a half out an f32 tensor rounded into it afterwards.
template <class Run>
void with_output(const Tensor& out, Run&& run) {
  if (!cpu_fast::is_half(out.dtype())) return run(out);
  const Tensor wide = empty(out.shape(), {.dtype = DType::f32});
  run(wide);
  Tensor(out).copy_(wide);
}
inline Tensor widened(const Tensor& t) { return cpu_fast::is_half(t.dtype()) ? t.to(DType::f32) : t; }

// out = f(x) in the kernel compute type of the input; out has the input's dtype, or bool.
template <bool FloatOnly, bool ToBool, class F>
void cpu_unary(const Tensor& in, const Tensor& out, F f) {
  if (cpu_fast::is_half(in.dtype())) {
    NoGradGuard no_grad;
    return with_output(out, [&](const Tensor& o) { cpu_unary<FloatOnly, ToBool>(widened(in), o, f); });
  }
  visit_dtype<FloatOnly>(in.dtype(), [&]<class TA>() {
    cpu::map_unary<TA, out_t<TA, ToBool>>(in, out, [&](auto x) { return f(static_cast<kc_t<TA>>(x)); });
  });
}

// out = f(a, b) with broadcasting; a and b share a dtype (the dtype plan promoted them).
template <bool FloatOnly, bool ToBool, class F>
void cpu_binary(const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  if (cpu_fast::is_half(a.dtype())) {
    NoGradGuard no_grad;
    return with_output(out, [&](const Tensor& o) { cpu_binary<FloatOnly, ToBool>(widened(a), widened(b), o, f); });
  }
  visit_dtype<FloatOnly>(a.dtype(), [&]<class TA>() {
    using C = kc_t<TA>;
    cpu::map_binary<TA, TA, out_t<TA, ToBool>>(a, b, out,
                                               [&](auto x, auto y) { return f(static_cast<C>(x), static_cast<C>(y)); });
  });
}

// out = f(x, s), or f(s, x) when scalar_first; s converted as the kernel converts it.
template <bool FloatOnly, bool ToBool, class F>
void cpu_binary_scalar(const Tensor& in, const Scalar& s, bool scalar_first, const Tensor& out, F f) {
  if (cpu_fast::is_half(in.dtype())) {
    NoGradGuard no_grad;
    return with_output(out, [&](const Tensor& o) { cpu_binary_scalar<FloatOnly, ToBool>(widened(in), s, scalar_first, o, f); });
  }
  visit_dtype<FloatOnly>(in.dtype(), [&]<class TA>() {
    using C = kc_t<TA>;
    const C sc = scalar_as<C>(s);
    cpu::map_unary<TA, out_t<TA, ToBool>>(in, out, [&](auto x) {
      const C v = static_cast<C>(x);
      return scalar_first ? f(sc, v) : f(v, sc);
    });
  });
}

// A binary pointwise op: tensor-tensor with broadcasting. `f` is the CPU reference, a
// generic lambda over the compute type; `pw` the device expression of its kernel.
template <bool FloatOnly, bool ToBool, class F>
OpDef binary_def(std::string name, std::vector<DType> dtypes, DTypeRule rule, F f, PointwiseExpr pw) {
  OpDef d;
  d.name = name;
  d.num_inputs = 2;
  d.dtypes = std::move(dtypes);
  d.dtype_rule = std::move(rule);
  d.cpu = [f](const OpArgs& a, std::span<Tensor> out) { cpu_binary<FloatOnly, ToBool>(a.inputs[0], a.inputs[1], out[0], f); };
  d.gpu = [k = gpu::LazyKernel(name)](const OpArgs& a, std::span<Tensor> out) {
    const Shape& s = out[0].shape();
    const auto [p0, p1] = pointwise_params(a.op, a.attrs);
    kernels::launch_binary(k.get(), a.inputs[0].dtype(), out[0].dtype(), gpu::operand(a.inputs[0], s),
                           gpu::operand(a.inputs[1], s), gpu::operand(out[0]), s, stream_of(a.device), p0, p1);
  };
  d.pointwise = std::move(pw);
  return d;
}

// A tensor-scalar op: the scalar in attrs "scalar", first when `scalar_first`.
template <bool FloatOnly, bool ToBool, class F>
OpDef binary_scalar_def(std::string name, std::string kernel, bool scalar_first, std::vector<DType> dtypes,
                        DTypeRule rule, F f) {
  OpDef d;
  d.name = std::move(name);
  d.dtypes = std::move(dtypes);
  d.dtype_rule = std::move(rule);
  d.shape_rule = rules::same_shape_as_input;
  d.cpu = [f, scalar_first](const OpArgs& a, std::span<Tensor> out) {
    cpu_binary_scalar<FloatOnly, ToBool>(a.inputs[0], a.attrs.get<Scalar>("scalar"), scalar_first, out[0], f);
  };
  d.gpu = [k = gpu::LazyKernel(kernel), scalar_first](const OpArgs& a, std::span<Tensor> out) {
    kernels::launch_binary_scalar(k.get(), a.inputs[0].dtype(), out[0].dtype(), gpu::operand(a.inputs[0]),
                                  kernel_scalar(a.attrs.get<Scalar>("scalar")), scalar_first, gpu::operand(out[0]),
                                  out[0].shape(), stream_of(a.device));
  };
  d.scalar_form = ScalarForm{kernel, scalar_first};
  d.test.attrs = {Attrs{{"scalar", Scalar(2)}}, Attrs{{"scalar", Scalar(-1.5)}}};
  return d;
}

// A unary pointwise op: `f(x, p0, p1)` is the CPU reference over the compute type, with
// p0, p1 from pw.params as the kernel gets them.
template <bool FloatOnly, bool ToBool, class F>
OpDef unary_def(std::string name, std::vector<DType> dtypes, DTypeRule rule, F f, PointwiseExpr pw) {
  OpDef d;
  d.name = name;
  d.dtypes = std::move(dtypes);
  d.dtype_rule = std::move(rule);
  d.cpu = [f](const OpArgs& a, std::span<Tensor> out) {
    const auto [p0, p1] = pointwise_params(a.op, a.attrs);
    // Copies: clang before 16 cannot capture structured bindings.
    cpu_unary<FloatOnly, ToBool>(a.inputs[0], out[0], [&, p0 = p0, p1 = p1](auto x) { return f(x, p0, p1); });
  };
  d.gpu = [k = gpu::LazyKernel(name)](const OpArgs& a, std::span<Tensor> out) {
    const auto [p0, p1] = pointwise_params(a.op, a.attrs);
    kernels::launch_unary(k.get(), a.inputs[0].dtype(), out[0].dtype(), gpu::operand(a.inputs[0]),
                          gpu::operand(out[0]), out[0].shape(), p0, p1, stream_of(a.device));
  };
  d.pointwise = std::move(pw);
  return d;
}

// The dtype plan of a unary op whose output is bool whatever the input.
inline DTypePlan to_bool_plan(const OpArgs& a) {
  DTypePlan p;
  p.inputs = {a.inputs[0].dtype()};
  p.outputs = {DType::boolean};
  p.key = a.inputs[0].dtype();
  return p;
}

// g where mask is true, else 0 (mask: a bool tensor broadcastable to g).
inline Tensor masked(const Tensor& g, const Tensor& mask) { return where(mask, g, Scalar(0)); }

}  // namespace kiln::elementwise_defs
