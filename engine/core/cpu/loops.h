#pragma once
// Building blocks of the CPU reference: dtype dispatch, element load/store in the
// compute type (f16/bf16 compute in f32), strided N-d iteration and pairwise sums.
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/half.h"
#include "kiln/tensor.h"

namespace kiln::cpu {

// The C++ type of an element of `dtype` in host memory.
template <DType D> struct Storage;
template <> struct Storage<DType::f32> { using type = float; };
template <> struct Storage<DType::f64> { using type = double; };
template <> struct Storage<DType::f16> { using type = Half; };
template <> struct Storage<DType::bf16> { using type = BFloat16; };
template <> struct Storage<DType::i32> { using type = std::int32_t; };
template <> struct Storage<DType::i64> { using type = std::int64_t; };
template <> struct Storage<DType::u8> { using type = std::uint8_t; };
template <> struct Storage<DType::boolean> { using type = bool; };

// The type arithmetic happens in: f32 for f16/bf16, the storage type otherwise.
template <class T> struct ComputeOf { using type = T; };
template <> struct ComputeOf<Half> { using type = float; };
template <> struct ComputeOf<BFloat16> { using type = float; };
template <class T> using compute_t = typename ComputeOf<T>::type;

template <class T>
inline compute_t<T> load(const T& v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) return static_cast<float>(v);
  else return v;
}
// Float to integer, truncating toward zero and saturating (NaN -> 0), as the GPU's cvt does.
template <class I, class F>
inline I saturate(F v) {
  if (v != v) return I(0);
  if (v <= static_cast<F>(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
  if (v >= static_cast<F>(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return static_cast<I>(v);
}

// Converts a compute value to storage type T with the kernels' conventions
// (kernel_templates/prelude.cu): f16/bf16 through f32, nonzero (and NaN) to
// bool is true, float to integer truncates and saturates, float to u8 wraps through i64.
template <class T, class V>
inline T store(V v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return T(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, bool>) {
    return v != V(0);
  } else if constexpr (std::is_floating_point_v<V> && std::is_integral_v<T>) {
    if constexpr (std::is_same_v<T, std::uint8_t>) return static_cast<std::uint8_t>(saturate<std::int64_t>(v));
    else return saturate<T>(v);
  } else {
    return static_cast<T>(v);
  }
}

// Calls f.template operator()<T>() with T the storage type of `dtype`:
//   visit(dt, [&]<class T>() { ... });
template <class F>
decltype(auto) visit(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    case DType::f16: return f.template operator()<Half>();
    case DType::bf16: return f.template operator()<BFloat16>();
    case DType::i32: return f.template operator()<std::int32_t>();
    case DType::i64: return f.template operator()<std::int64_t>();
    case DType::u8: return f.template operator()<std::uint8_t>();
    case DType::boolean: return f.template operator()<bool>();
  }
  throw DTypeError("[cpu] unknown dtype");
}

// Strides of `in` viewed at `out_shape` under NumPy broadcasting (0 where broadcast).
// `in_shape` must broadcast to `out_shape`.
Shape broadcast_strides(const Shape& in_shape, const Shape& in_strides, const Shape& out_shape);

// Walks `shape` row-major, calling f(offsets) with one element offset per operand
// (operand k advances by strides[k]). The innermost dimension is a plain loop.
template <std::size_t N, class F>
void for_each_offset(const Shape& shape, const std::array<const Shape*, N>& strides,
                     std::array<std::int64_t, N> base, F&& f) {
  const int nd = static_cast<int>(shape.size());
  for (std::int64_t s : shape)
    if (s == 0) return;
  if (nd == 0) {
    f(base);
    return;
  }
  const std::int64_t inner = shape[nd - 1];
  std::array<std::int64_t, N> step{};
  for (std::size_t k = 0; k < N; ++k) step[k] = (*strides[k])[nd - 1];
  std::vector<std::int64_t> idx(static_cast<std::size_t>(nd), 0);
  std::array<std::int64_t, N> off = base;
  while (true) {
    std::array<std::int64_t, N> o = off;
    for (std::int64_t i = 0; i < inner; ++i) {
      f(o);
      for (std::size_t k = 0; k < N; ++k) o[k] += step[k];
    }
    int d = nd - 2;
    for (; d >= 0; --d) {
      for (std::size_t k = 0; k < N; ++k) off[k] += (*strides[k])[d];
      if (++idx[d] < shape[d]) break;
      for (std::size_t k = 0; k < N; ++k) off[k] -= (*strides[k])[d] * shape[d];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

// Typed element pointer of a CPU tensor (its first element).
template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

// out[i] = f(a[i]) over out's shape; `a` broadcasts to it. f takes and returns compute
// types; the result is stored as out's dtype. Both run on the host.
template <class TA, class TO, class F>
void map_unary(const Tensor& a, const Tensor& out, F&& f) {
  const TA* pa = ptr<const TA>(a);
  TO* po = ptr<TO>(out);
  Shape sa = broadcast_strides(a.shape(), a.strides(), out.shape());
  for_each_offset<2>(out.shape(), {&out.strides(), &sa}, {0, 0},
                     [&](const std::array<std::int64_t, 2>& o) { po[o[0]] = store<TO>(f(load(pa[o[1]]))); });
}

template <class TA, class TB, class TO, class F>
void map_binary(const Tensor& a, const Tensor& b, const Tensor& out, F&& f) {
  const TA* pa = ptr<const TA>(a);
  const TB* pb = ptr<const TB>(b);
  TO* po = ptr<TO>(out);
  Shape sa = broadcast_strides(a.shape(), a.strides(), out.shape());
  Shape sb = broadcast_strides(b.shape(), b.strides(), out.shape());
  for_each_offset<3>(out.shape(), {&out.strides(), &sa, &sb}, {0, 0, 0}, [&](const std::array<std::int64_t, 3>& o) {
    po[o[0]] = store<TO>(f(load(pa[o[1]]), load(pb[o[2]])));
  });
}

// Pairwise (cascade) sum: O(log n) error growth instead of O(n).
template <class Acc>
Acc pairwise_sum(const Acc* v, std::int64_t n) {
  if (n <= 64) {
    Acc s = Acc(0);
    for (std::int64_t i = 0; i < n; ++i) s += v[i];
    return s;
  }
  std::int64_t half = n / 2;
  return pairwise_sum(v, half) + pairwise_sum(v + half, n - half);
}

// For a reduction of `in` over `axes` (normalised, sorted): calls
// f(out_index, values) for each output element in row-major order, where `values`
// holds the reduced elements converted to Acc, in row-major order of the reduced axes.
template <class T, class Acc, class F>
void for_each_reduction(const Tensor& in, const std::vector<int>& axes, F&& f) {
  const int nd = in.dim();
  std::vector<bool> reduced(static_cast<std::size_t>(nd), false);
  for (int a : axes) reduced[static_cast<std::size_t>(a)] = true;
  Shape kept_shape, kept_strides, red_shape, red_strides;
  for (int d = 0; d < nd; ++d) {
    auto& sh = reduced[d] ? red_shape : kept_shape;
    auto& st = reduced[d] ? red_strides : kept_strides;
    sh.push_back(in.shape()[d]);
    st.push_back(in.strides()[d]);
  }
  const T* p = ptr<const T>(in);
  std::int64_t n_red = shape_numel(red_shape);
  std::vector<Acc> values(static_cast<std::size_t>(n_red));
  std::int64_t out_index = 0;
  auto per_output = [&](const std::array<std::int64_t, 1>& base) {
    std::size_t k = 0;
    for_each_offset<1>(red_shape, {&red_strides}, base,
                       [&](const std::array<std::int64_t, 1>& o) { values[k++] = static_cast<Acc>(load(p[o[0]])); });
    f(out_index++, std::span<const Acc>(values));
  };
  for_each_offset<1>(kept_shape, {&kept_strides}, {0}, per_output);
}

}  // namespace kiln::cpu
