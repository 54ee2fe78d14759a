#pragma once
// Cases of the registry-driven consistency suite: which input shapes, layouts, dtypes and
// values one op is run with, generated from its OpDef (arity, dtypes, TestHints) alone, and
// the inputs built from them on the CPU (seeded) and copied to the GPU with the same layout.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/registry.h"
#include "kiln/kiln.h"
#include "kiln/random.h"

namespace consistency {

using kiln::Attrs;
using kiln::DType;
using kiln::Shape;
using kiln::Tensor;

enum class Layout { contiguous, transposed, strided };

struct InputSpec {
  Shape shape{};
  Layout layout = Layout::contiguous;
  std::optional<DType> dtype{};  // fixed by a hint (indices, labels, conditions); else the case's
  double low = 0, high = 0;      // this input's range when low < high; else the op's
  bool index_like = false;       // integer indices/labels: [low, high) follows the other shapes
};

struct Case {
  std::string name;  // add(dtype=f16, shape=[5,7,11,13])
  DType dtype = DType::f32;
  std::vector<InputSpec> inputs;
  Attrs attrs;
  bool special = false;  // NaN/Inf/zeros mixed into floating inputs
};

// Per-input overrides and explicit shape sets, used when TestHints has them (see the
// proposal at the top of test_consistency.cpp); absent fields leave the generic cases.
template <class H>
std::optional<DType> hint_dtype(const H& h, std::size_t i) {
  if constexpr (requires { h.inputs[i].dtype; }) {
    if (i < h.inputs.size()) return h.inputs[i].dtype;
  }
  return std::nullopt;
}
template <class H>
std::pair<double, double> hint_range(const H& h, std::size_t i) {
  if constexpr (requires { h.inputs[i].low; }) {
    if (i < h.inputs.size()) return {h.inputs[i].low, h.inputs[i].high};
  }
  return {0.0, 0.0};
}
template <class H>
std::vector<std::vector<Shape>> hint_shapes(const H& h) {
  if constexpr (requires { h.shapes; }) {
    return {h.shapes.begin(), h.shapes.end()};
  }
  return {};
}

inline std::string dims_str(const Shape& s) {
  std::string r = "[";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

inline const char* layout_name(Layout l) {
  return l == Layout::transposed ? "transposed" : l == Layout::strided ? "strided" : "contiguous";
}

// Input shape/layout sets for an op of `n` inputs (-1: any number, 0: none).
inline std::vector<std::vector<InputSpec>> shape_sets(int n, bool same_shape) {
  const Shape odd{5, 7, 11, 13};
  std::vector<std::vector<InputSpec>> sets;
  if (n == 0) return {{}};
  const int k = n < 0 ? 2 : n;
  auto all = [&](const Shape& s, Layout l) { return std::vector<InputSpec>(static_cast<std::size_t>(k), {s, l}); };
  for (const Shape& s : {Shape{}, Shape{1}, Shape{128, 2, 2, 2}, odd}) sets.push_back(all(s, Layout::contiguous));
  sets.push_back(all(odd, Layout::transposed));
  sets.push_back(all(odd, Layout::strided));
  if (k >= 2) {
    // Mixed layouts: the first input transposed, the others sliced with steps.
    std::vector<InputSpec> mixed = all(odd, Layout::strided);
    mixed[0].layout = Layout::transposed;
    sets.push_back(mixed);
  }
  if (n < 0) {
    sets.push_back({{odd}});
    sets.push_back(std::vector<InputSpec>(3, {Shape{5, 7}}));
  }
  if (n >= 2 && !same_shape) {
    // Broadcasting: size-1 dims against full ones, fewer dims, and a 0-d operand.
    const std::vector<Shape> pair{{5, 1, 11, 1}, {7, 1, 13}, {1, 11, 13}};
    std::vector<InputSpec> b, scalar_first, strided_b;
    for (int i = 0; i < n; ++i) {
      b.push_back({pair[static_cast<std::size_t>(i % 3)]});
      scalar_first.push_back({i == 0 ? Shape{} : Shape{5, 7}});
      strided_b.push_back({pair[static_cast<std::size_t>(i % 3)], i == 0 ? Layout::strided : Layout::transposed});
    }
    sets.push_back(b);
    sets.push_back(scalar_first);
    sets.push_back(strided_b);
  }
  return sets;
}

inline std::string case_name(const std::string& op, DType dt, const std::vector<InputSpec>& in, const Attrs& attrs,
                             bool special, bool variadic = false) {
  std::ostringstream os;
  // Ops without inputs name their dtype in their attrs.
  if (in.empty() && attrs.has("dtype")) return op + "(" + attrs.str() + ")";
  os << op << "(dtype=" << kiln::dtype_name(dt);
  bool same = true;
  for (const InputSpec& s : in) same = same && s.shape == in[0].shape && s.layout == in[0].layout;
  if (!in.empty() && same) {
    os << ", shape=" << dims_str(in[0].shape);
    if (variadic) os << "x" << in.size();
    if (in[0].layout != Layout::contiguous) os << ", view=" << layout_name(in[0].layout);
  } else if (!in.empty()) {
    os << ", shapes=";
    for (std::size_t i = 0; i < in.size(); ++i) {
      os << (i ? "," : "") << dims_str(in[i].shape);
      if (in[i].layout != Layout::contiguous) os << ":" << layout_name(in[i].layout);
    }
  }
  for (std::size_t i = 0; i < in.size(); ++i)
    if (in[i].dtype) os << ", in" << i << "=" << kiln::dtype_name(*in[i].dtype);
  if (!attrs.items().empty()) os << ", " << attrs.str();
  if (special) os << ", values=nan_inf";
  os << ")";
  return os.str();
}

// Without hints for it, an input that must not have the case's dtype (a bool condition,
// integer indices or labels) is found by trying, one input at a time, bool then i64 where
// the all-`dt` call fails the dtype rule. Zeros of shape [5,7]: safe as indices. Returns
// the input and its dtype, or nothing when the op takes all-`dt` inputs (or nothing fits).
inline std::optional<std::pair<std::size_t, DType>> find_special_input(const kiln::OpDef& op, DType dt,
                                                                       const Attrs& attrs, std::size_t n) {
  auto dtype_ok = [&](std::optional<std::pair<std::size_t, DType>> sub) {
    std::vector<Tensor> in;
    for (std::size_t i = 0; i < n; ++i)
      in.push_back(kiln::zeros({5, 7}, {.dtype = sub && sub->first == i ? sub->second : dt}));
    try {
      (void)kiln::dispatch(op, in, attrs);
    } catch (const kiln::DTypeError&) {
      return false;
    } catch (const kiln::Error&) {
      // Past the dtype rule (a shape or value complaint): the dtypes were accepted.
    }
    return true;
  };
  if (n < 2 || dtype_ok(std::nullopt)) return std::nullopt;
  for (DType sub : {DType::boolean, DType::i64})
    for (std::size_t i = 0; i < n; ++i)
      if (sub != dt && dtype_ok(std::pair{i, sub})) return std::pair{i, sub};
  return std::nullopt;
}

// Integer inputs standing for indices or labels take values in [0, the smallest size of any
// other input's dims), valid along every axis and as a class index.
inline void bound_index_inputs(std::vector<InputSpec>& set) {
  for (std::size_t i = 0; i < set.size(); ++i) {
    if (!set[i].index_like) continue;
    std::int64_t m = std::numeric_limits<std::int64_t>::max();
    for (std::size_t j = 0; j < set.size(); ++j)
      if (j != i)
        for (std::int64_t d : set[j].shape) m = std::min(m, d);
    set[i].low = 0;
    set[i].high = static_cast<double>(m == std::numeric_limits<std::int64_t>::max() ? 1 : std::max<std::int64_t>(m, 1));
  }
}

// Marks the input find_special_input finds for any of the op's dtypes in every set, so an
// op that also takes integer indices of the case's dtype (gather on i32) still gets
// in-range i64 indices (the GPU cannot check index values without synchronising).
inline void apply_special_input(const kiln::OpDef& op, const Attrs& attrs, std::vector<std::vector<InputSpec>>& sets) {
  if (op.num_inputs == 0 || sets.empty()) return;
  std::optional<std::pair<std::size_t, DType>> sub;
  for (DType dt : op.dtypes.empty() ? std::vector<DType>(kiln::kAllDTypes.begin(), kiln::kAllDTypes.end()) : op.dtypes)
    if ((sub = find_special_input(op, dt, attrs, sets.front().size()))) break;
  if (!sub) return;
  for (auto& set : sets) {
    if (sub->first >= set.size()) continue;
    set[sub->first].dtype = sub->second;
    set[sub->first].index_like = sub->second == DType::i64;
    bound_index_inputs(set);
  }
}

// Every case of one op: dtypes x attrs sets x input shape sets, plus one NaN/Inf case per
// floating dtype. Ops without tensor inputs take the case's dtype through attrs "dtype".
inline std::vector<Case> make_cases(const kiln::OpDef& op) {
  std::vector<DType> dtypes = op.dtypes;
  if (dtypes.empty()) dtypes.assign(kiln::kAllDTypes.begin(), kiln::kAllDTypes.end());
  std::vector<std::vector<InputSpec>> sets;
  for (const auto& shapes : hint_shapes(op.test)) {
    std::vector<InputSpec> set;
    for (const Shape& s : shapes) set.push_back({s});
    sets.push_back(set);
  }
  const bool hinted_shapes = !sets.empty();
  if (!hinted_shapes) sets = shape_sets(op.num_inputs, op.test.same_shape_inputs);
  bool hinted_dtypes = false;
  for (auto& set : sets) {
    for (std::size_t i = 0; i < set.size(); ++i) {
      set[i].dtype = hint_dtype(op.test, i);
      std::tie(set[i].low, set[i].high) = hint_range(op.test, i);
      hinted_dtypes = hinted_dtypes || set[i].dtype.has_value();
    }
  }

  std::vector<std::vector<std::vector<InputSpec>>> sets_by_attrs;  // with special inputs marked
  for (const Attrs& attrs : op.test.attrs) {
    sets_by_attrs.push_back(sets);
    if (!hinted_dtypes) apply_special_input(op, attrs, sets_by_attrs.back());
  }

  std::vector<Case> cases;
  for (DType dt : dtypes) {
    for (std::size_t a = 0; a < op.test.attrs.size(); ++a) {
      Attrs attrs = op.test.attrs[a];
      if (op.num_inputs == 0 && attrs.has("dtype")) attrs.set("dtype", dt);
      const std::vector<std::vector<InputSpec>>& these = sets_by_attrs[a];
      for (const auto& set : these)
        cases.push_back({case_name(op.name, dt, set, attrs, false, op.num_inputs < 0), dt, set, attrs, false});
      if (kiln::is_floating(dt) && op.num_inputs != 0) {
        std::vector<InputSpec> set = these.front();
        if (!hinted_shapes) {
          for (InputSpec& s : set) s.shape = Shape{4, 9};  // small: every special value meets every other
          bound_index_inputs(set);
        }
        cases.push_back({case_name(op.name, dt, set, attrs, true, op.num_inputs < 0), dt, set, attrs, true});
      }
    }
  }
  return cases;
}

// The storage an input view lives in, and where the view sits in it.
struct ViewPlan {
  Shape base;
  Shape strides;
  std::int64_t offset = 0;
};

inline ViewPlan view_plan(const InputSpec& in) {
  Shape base = in.shape;
  const std::size_t nd = base.size();
  if (in.layout == Layout::transposed && nd >= 2) {
    std::swap(base[nd - 2], base[nd - 1]);
    Shape st = kiln::contiguous_strides(base);
    std::swap(st[nd - 2], st[nd - 1]);
    return {base, st, 0};
  }
  if (in.layout == Layout::strided && nd >= 1) {
    // Every other element of the last dim, starting one row (1-d: one element) in.
    base[nd - 1] *= 2;
    base[0] += 1;
    Shape st = kiln::contiguous_strides(base);
    const std::int64_t off = nd >= 2 ? st[0] : 1;
    st[nd - 1] *= 2;
    return {base, st, off};
  }
  return {base, kiln::contiguous_strides(base), 0};
}

// Random values of `dt` in [low, high): uniform for floats, uniform integers for ints
// (u8 clipped at 0), fair coin flips for bool.
inline Tensor random_tensor(const Shape& shape, DType dt, double low, double high, kiln::Generator& gen) {
  using namespace kiln;
  if (is_floating(dt)) return add(mul(rand(shape, {.dtype = DType::f64}, &gen), high - low), low).to(dt);
  if (dt == DType::boolean) return randint(0, 2, shape, {.dtype = DType::i64}, &gen).to(dt);
  auto lo = static_cast<std::int64_t>(std::ceil(low));
  auto hi = static_cast<std::int64_t>(std::ceil(high));  // exclusive
  if (dt == DType::u8) lo = std::max<std::int64_t>(lo, 0);
  if (hi <= lo) hi = lo + 1;
  return randint(lo, hi, shape, {.dtype = DType::i64}, &gen).to(dt);
}

// Overwrites a pattern of elements with NaN, +-Inf, +-0 and huge values; `shift`
// varies the pattern between inputs so specials meet finite values and each other.
inline Tensor with_specials(const Tensor& t, int shift) {
  std::vector<double> v = t.to_vector<double>();
  const double inf = std::numeric_limits<double>::infinity();
  const double specials[] = {std::nan(""), inf, -inf, 0.0, -0.0, 6e4};
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::size_t k = (i + static_cast<std::size_t>(shift) * 2) % 9;
    if (k < 6) v[i] = specials[k];
  }
  return kiln::from_vector(v, t.shape(), {.dtype = t.dtype()});
}

// One input on both devices: a base storage filled on the CPU, copied as-is to the GPU,
// and the same view of each.
struct InputPair {
  Tensor cpu, gpu;
};

inline InputPair make_input(const InputSpec& in, DType case_dtype, const kiln::TestHints& hints, bool special,
                            int index, kiln::Generator& gen, kiln::Device gpu) {
  const DType dt = in.dtype.value_or(case_dtype);
  const bool own_range = in.low < in.high;
  const ViewPlan p = view_plan(in);
  Tensor base = random_tensor(p.base, dt, own_range ? in.low : hints.low, own_range ? in.high : hints.high, gen);
  if (special && kiln::is_floating(dt) && (hints.specials_input < 0 || hints.specials_input == index))
    base = with_specials(base, index);
  Tensor base_gpu = base.to(gpu);
  if (in.layout == Layout::contiguous || in.shape.empty()) return {base, base_gpu};
  return {kiln::make_view(base, in.shape, p.strides, p.offset),
          kiln::make_view(base_gpu, in.shape, p.strides, p.offset)};
}

}  // namespace consistency
