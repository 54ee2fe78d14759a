#pragma once
// What the reduction ops (reduction.cpp, reduction_minmax.cpp, reduction_stats.cpp) share:
// attrs "axes" (absent: every dim) and "keepdim", their shape rules, the CPU loop with a
// per-dtype accumulator, the GPU launch and the broadcast of a gradient back to the input.
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kiln/autograd.h"
#include "kiln/reduction.h"
#include "core/registry.h"

namespace kiln::reduction {

// Normalised, sorted reduced axes; a bad axis is a ShapeError naming the op and the shape.
std::vector<int> axes_of(const Attrs& attrs, const Shape& shape, std::string_view op);
inline std::vector<int> axes_of(const OpArgs& a) { return axes_of(a.attrs, a.inputs[0].shape(), a.name()); }
inline bool keepdim_of(const Attrs& attrs) { return attrs.get_or("keepdim", false); }

// Output shape of a reduction; `needs_nonempty` ops (max, min, argmax, argmin) have no
// identity and throw ValueError naming the op when a reduced dim is empty.
std::vector<Shape> shape_rule(const OpArgs& a, bool needs_nonempty);
// Elements reduced into each output element.
std::int64_t reduced_count(const Shape& in, const std::vector<int>& axes);

// Launches the op's reduce kernel over the input (reordered when its layout needs it).
void gpu_reduce(const rt::KernelSpec& spec, const OpArgs& a, const Tensor& out, double param = 0);

// The var/std correction (attr "correction", integer or floating; default 1).
double correction_of(const Attrs& attrs);

// t (shaped like the op's output) broadcast back to the input's shape.
Tensor expand_back(const Tensor& t, const VjpContext& c);
std::vector<std::int64_t> axes_i64(const VjpContext& c);
// An op of another family called through the registry, so this family does not depend
// on that family's header.
Tensor run_op(std::string_view name, std::initializer_list<Tensor> inputs);

// Attribute sets the registry-driven tests try on every reduction.
std::vector<Attrs> test_attrs();

// Accumulators: f32 for f32/f16/bf16, f64 for f64, i64 for integers and bool.
template <class T>
using WideAcc = std::conditional_t<std::is_same_v<T, double>, double,
                                   std::conditional_t<std::is_floating_point_v<cpu::compute_t<T>>, float, std::int64_t>>;
// The element type a value computes in, unwidened (max/min/argmax/argmin); bool as u8
// (a std::vector<bool> has no span).
template <class T>
using SameAcc = std::conditional_t<std::is_same_v<T, bool>, std::uint8_t, cpu::compute_t<T>>;

// Stores a result R into element i of out, whatever out's dtype: picked once per call, so the
// reduction loop below is instantiated per input dtype, not per (input, output) pair.
template <class R>
using StoreFn = void (*)(void* out, std::int64_t i, R v);
template <class R>
StoreFn<R> store_fn(DType out) {
  return cpu::visit(out, []<class O>() -> StoreFn<R> {
    return [](void* p, std::int64_t i, R v) { static_cast<O*>(p)[i] = cpu::store<O>(v); };
  });
}

// The dtype an input is reduced as: another whose values the accumulator sees the same (f16
// and bf16 widen to f32 exactly; for the widening accumulators, integers and bool to i64), so
// fewer loops are compiled with the same results.
template <template <class> class Acc>
inline constexpr bool kWidensIntegers = std::is_same_v<Acc<std::int32_t>, std::int64_t>;
template <template <class> class Acc>
DType reduced_as(DType t) {
  if (t == DType::f16 || t == DType::bf16) return DType::f32;
  if (kWidensIntegers<Acc> && (t == DType::i32 || t == DType::u8 || t == DType::boolean)) return DType::i64;
  return t;
}

// out[i] = f(values reduced into element i), values converted to Acc<T>; f returns a value
// stored as out's dtype.
template <template <class> class Acc, class F>
void cpu_reduce(const Tensor& in, const std::vector<int>& axes, const Tensor& out, F&& f) {
  if (const DType as = reduced_as<Acc>(in.dtype()); as != in.dtype()) {
    NoGradGuard no_grad;
    return cpu_reduce<Acc>(in.to(as), axes, out, f);
  }
  auto run = [&]<class T>() {
    using A = Acc<T>;
    using R = decltype(f(std::span<const A>{}));
    const StoreFn<R> put = store_fn<R>(out.dtype());
    void* po = out.data_ptr();
    cpu::for_each_reduction<T, A>(in, axes, [&](std::int64_t i, std::span<const A> v) { put(po, i, f(v)); });
  };
  switch (in.dtype()) {
    case DType::f32: return run.template operator()<float>();
    case DType::f64: return run.template operator()<double>();
    case DType::i64: return run.template operator()<std::int64_t>();
    default: break;
  }
  if constexpr (!kWidensIntegers<Acc>) {  // else reduced_as made them i64
    switch (in.dtype()) {
      case DType::i32: return run.template operator()<std::int32_t>();
      case DType::u8: return run.template operator()<std::uint8_t>();
      case DType::boolean: return run.template operator()<bool>();
      default: break;
    }
  }
  throw DTypeError("[cpu] no reduction loop for dtype " + std::string(dtype_name(in.dtype())));
}

template <class A>
inline bool is_nan(A v) {
  if constexpr (std::is_floating_point_v<A>) return v != v;
  else return false;
}

}  // namespace kiln::reduction
