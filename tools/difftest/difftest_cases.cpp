#include "difftest_cases.h"

#include <cmath>
#include <limits>
#include <map>

namespace difftest {

namespace {

using Sets = std::vector<std::vector<InputSpec>>;

std::vector<InputSpec> all(int k, const Shape& s, Layout l = Layout::contiguous) {
  return std::vector<InputSpec>(static_cast<std::size_t>(k), InputSpec{s, l});
}

// Small shapes: 0-d, [1], odd sizes, 3-d and 4-d (for permute and multi-axis reductions),
// transposed and stepped views, and broadcasting against size-1 dims and 0-d operands.
Sets generic_sets(int n, bool same_shape) {
  if (n == 0) return {{}};
  const int k = n < 0 ? 2 : n;
  Sets sets;
  for (const Shape& s : {Shape{}, Shape{1}, Shape{5, 7}, Shape{2, 3, 4}, Shape{2, 3, 4, 5}}) sets.push_back(all(k, s));
  sets.push_back(all(k, {5, 7}, Layout::transposed));
  sets.push_back(all(k, {2, 3, 4}, Layout::strided));
  if (k >= 2) {
    std::vector<InputSpec> mixed = all(k, {5, 7}, Layout::strided);
    mixed[0].layout = Layout::transposed;
    sets.push_back(mixed);
  }
  if (n < 0) {
    sets.push_back({{Shape{5, 7}}});
    sets.push_back({{Shape{2, 7}}, {Shape{3, 7}}});
    sets.push_back(all(3, {5, 7}));
  }
  if (n >= 2 && !same_shape) {
    const std::vector<Shape> pair{{5, 1, 3}, {7, 1}, {1, 3}};
    std::vector<InputSpec> b, scalar_first, scalar_last, strided_b;
    for (int i = 0; i < n; ++i) {
      b.push_back({pair[static_cast<std::size_t>(i % 3)]});
      scalar_first.push_back({i == 0 ? Shape{} : Shape{5, 7}});
      scalar_last.push_back({i == n - 1 ? Shape{} : Shape{5, 7}});
      strided_b.push_back({i % 2 ? Shape{5, 1} : Shape{1, 7}, i == 0 ? Layout::strided : Layout::transposed});
    }
    for (auto& s : {b, scalar_first, scalar_last, strided_b}) sets.push_back(s);
  }
  return sets;
}

// Ops whose inputs must fit each other in ways the generic sets do not try.
const std::map<std::string, Sets>& extra_sets() {
  const Layout T = Layout::transposed, S = Layout::strided;
  static const std::map<std::string, Sets> m{
      {"matmul",
       {{{{5, 7}}, {{7, 3}}},
        {{{7}}, {{7, 3}}},
        {{{5, 7}}, {{7}}},
        {{{7}}, {{7}}},
        {{{2, 5, 7}}, {{7, 3}}},
        {{{2, 1, 5, 7}}, {{3, 7, 4}}},
        {{{5, 7}}, {{3, 7}}},
        {{{5, 7}, T}, {{7, 3}, S}},
        {{{2, 5, 7}, S}, {{2, 3, 7}, T}}}},
      {"conv2d",
       {{{{2, 4, 7, 6}}, {{3, 4, 3, 3}}}, {{{1, 4, 5, 5}}, {{4, 2, 3, 3}}}, {{{2, 4, 7, 6}, T}, {{6, 2, 3, 3}, S}}}},
      {"index_select", {{{{5, 7}}, {{4}}}, {{{5, 7}, S}, {{3}}}, {{{6}}, {{4}}}}},
      {"gather", {{{{5, 7}}, {{3, 7}}}}},
      {"max_pool2d", {{{{2, 3, 7, 6}}}, {{{2, 3, 7, 6}, T}}}},
      {"avg_pool2d", {{{{2, 3, 7, 6}}}, {{{2, 3, 7, 6}, T}}}},
  };
  return m;
}

// Pairs of input dtypes for ops of several inputs: PyTorch's promotion across categories,
// f16 with bf16, and widening within a category.
const std::vector<std::pair<DType, DType>> kMixedPairs{
    {DType::f32, DType::f64},     {DType::f64, DType::f16},     {DType::f16, DType::f32}, {DType::bf16, DType::f16},
    {DType::bf16, DType::f32},    {DType::i32, DType::f32},     {DType::f16, DType::i64}, {DType::u8, DType::i32},
    {DType::boolean, DType::f32}, {DType::i64, DType::boolean}, {DType::u8, DType::bf16}, {DType::i32, DType::i64},
    {DType::u8, DType::f64}};

bool takes_edges(const InputSpec& s) { return !(s.low < s.high) && !s.index_like; }

// Inputs that take the case's values (not indices, labels or a hinted bool condition).
std::vector<std::size_t> data_inputs(const std::vector<InputSpec>& set, bool hinted_dtypes) {
  std::vector<std::size_t> d;
  for (std::size_t i = 0; i < set.size(); ++i)
    if (takes_edges(set[i]) && !(hinted_dtypes && set[i].dtype)) d.push_back(i);
  return d;
}

std::size_t edge_count(DType dt) {
  return kiln::is_floating(dt) ? float_edges(dt).size() : dt == DType::boolean ? 2 : int_edges(dt).size();
}

std::string named(const kiln::OpDef& op, DType dt, const std::vector<InputSpec>& set, const Attrs& attrs, Values v) {
  std::string n = consistency::case_name(op.name, dt, set, attrs, false, op.num_inputs < 0);
  if (v != Values::random) n.insert(n.size() - 1, std::string(", values=") + values_name(v));
  return n;
}

}  // namespace

const char* values_name(Values v) {
  return v == Values::edge_grid ? "edge_grid" : v == Values::edge_sparse ? "edge_sparse" : "random";
}

std::vector<double> float_edges(DType dt) {
  double max = 0, denorm = 0, normal = 0;
  switch (dt) {
    case DType::f64:
      max = std::numeric_limits<double>::max(), denorm = std::numeric_limits<double>::denorm_min();
      normal = std::numeric_limits<double>::min();
      break;
    case DType::f16:
      max = 65504.0, denorm = std::ldexp(1.0, -24), normal = std::ldexp(1.0, -14);
      break;
    case DType::bf16:
      max = std::ldexp(255.0, 120), denorm = std::ldexp(1.0, -133), normal = std::ldexp(1.0, -126);
      break;
    default:
      max = std::numeric_limits<float>::max(), denorm = std::numeric_limits<float>::denorm_min();
      normal = std::numeric_limits<float>::min();
  }
  const double inf = std::numeric_limits<double>::infinity();
  // 2 sqrt(max) overflows when squared, log(max) + 1 when exponentiated: both rounded to
  // a power of two so every dtype stores them exactly.
  const double square_over = std::exp2(std::ceil(std::log2(std::sqrt(max))) + 1);
  const double exp_over = std::ceil(std::log(max)) + 1;
  return {0.0,    -0.0, 1.0,  -1.0,        0.5,      -3.0, denorm, -3 * denorm,
          normal, max,  -max, square_over, exp_over, inf,  -inf,   std::nan("")};
}

std::vector<std::int64_t> int_edges(DType dt) {
  switch (dt) {
    case DType::u8:
      return {0, 1, 2, 15, 16, 127, 128, 254, 255};
    case DType::i32: {
      const std::int64_t mx = std::numeric_limits<std::int32_t>::max(), mn = std::numeric_limits<std::int32_t>::min();
      return {0, 1, -1, 2, -3, 46341, mx, mn, mx - 1, mn + 1};
    }
    default: {
      const std::int64_t mx = std::numeric_limits<std::int64_t>::max(), mn = std::numeric_limits<std::int64_t>::min();
      return {0, 1, -1, 2, -3, 3037000500, mx, mn, mx - 1, mn + 1};
    }
  }
}

std::vector<Case> make_cases(const kiln::OpDef& op) {
  std::vector<DType> dtypes = op.dtypes;
  if (dtypes.empty()) dtypes.assign(kiln::kAllDTypes.begin(), kiln::kAllDTypes.end());
  Sets sets;
  for (const auto& shapes : consistency::hint_shapes(op.test)) {
    std::vector<InputSpec> set;
    for (const Shape& s : shapes) set.push_back({s});
    sets.push_back(set);
  }
  const bool fitted = !sets.empty() || extra_sets().count(op.name);
  if (sets.empty()) sets = generic_sets(op.num_inputs, op.test.same_shape_inputs);
  if (auto it = extra_sets().find(op.name); it != extra_sets().end())
    sets.insert(sets.begin(), it->second.begin(), it->second.end());
  bool hinted_dtypes = false;
  for (auto& set : sets) {
    for (std::size_t i = 0; i < set.size(); ++i) {
      set[i].dtype = consistency::hint_dtype(op.test, i);
      std::tie(set[i].low, set[i].high) = consistency::hint_range(op.test, i);
      hinted_dtypes = hinted_dtypes || set[i].dtype.has_value();
    }
  }

  std::vector<Case> cases;
  auto add = [&](DType dt, const std::vector<InputSpec>& set, const Attrs& attrs, Values v) {
    cases.push_back({named(op, dt, set, attrs, v), dt, set, attrs, v});
  };
  for (const Attrs& base_attrs : op.test.attrs) {
    Sets these = sets;
    if (!hinted_dtypes) consistency::apply_special_input(op, base_attrs, these);
    const std::vector<std::size_t> data = data_inputs(these.front(), hinted_dtypes);

    // Edge-valued sets: a grid where every pair of values meets, and a sparse 4-d one.
    auto edge_sets = [&](const std::vector<DType>& dts) {
      std::vector<std::pair<std::vector<InputSpec>, Values>> r;
      std::vector<InputSpec> sparse = these.front();
      if (!fitted) {
        for (InputSpec& s : sparse) s.shape = {2, 3, 4, 5};
        sparse[0].layout = Layout::transposed;
        consistency::bound_index_inputs(sparse);
        if (!data.empty()) {
          std::vector<InputSpec> grid = these.front();
          const std::int64_t rows = static_cast<std::int64_t>(edge_count(dts[0]));
          const std::int64_t cols = data.size() > 1 ? static_cast<std::int64_t>(edge_count(dts[1])) : 3;
          for (InputSpec& s : grid) s = {{rows, cols}, Layout::contiguous, s.dtype, s.low, s.high, s.index_like};
          consistency::bound_index_inputs(grid);
          r.push_back({grid, Values::edge_grid});
        }
      }
      r.push_back({sparse, Values::edge_sparse});
      return r;
    };

    std::vector<DType> tried = dtypes;
    // Input dtypes outside .dtypes that the dtype rule promotes (exp of i32 is f32).
    if (op.num_inputs == 1 && data.size() == 1)
      for (DType dt : kiln::kAllDTypes)
        if (std::find(tried.begin(), tried.end(), dt) == tried.end()) tried.push_back(dt);
    for (DType dt : tried) {
      const bool listed = std::find(dtypes.begin(), dtypes.end(), dt) != dtypes.end();
      Attrs attrs = base_attrs;
      if (op.num_inputs == 0 && attrs.has("dtype")) attrs.set("dtype", dt);
      for (std::size_t s = 0; s < these.size(); ++s)
        if (listed || s < 3 || these[s][0].shape == Shape{5, 7}) add(dt, these[s], attrs, Values::random);
      if (op.num_inputs != 0 && dt != DType::boolean)
        for (const auto& [set, v] : edge_sets(std::vector<DType>(2, dt))) add(dt, set, attrs, v);
    }

    // Mixed input dtypes: data inputs alternate between the pair's dtypes.
    if (data.size() >= 2) {
      for (const auto& pair : kMixedPairs) {
        const DType a = pair.first, b = pair.second;  // copies: clang 14 cannot capture bindings
        auto mix = [&](std::vector<InputSpec> set) {
          for (std::size_t k = 0; k < data.size(); ++k) set[data[k]].dtype = k % 2 ? b : a;
          return set;
        };
        for (const Shape& second : {Shape{5, 7}, Shape{}}) {
          std::vector<InputSpec> set = these.front();
          if (!fitted)
            for (std::size_t k = 0; k < set.size(); ++k) set[k].shape = k == data[1] ? second : Shape{5, 7};
          consistency::bound_index_inputs(set);
          add(a, mix(set), base_attrs, Values::random);
          if (fitted) break;
        }
        for (const auto& [set, v] : edge_sets({a, b})) add(a, mix(set), base_attrs, v);
      }
    }
  }
  return cases;
}

std::vector<Input> make_inputs(const kiln::OpDef& op, const Case& c, kiln::Generator& gen) {
  std::vector<Input> out;
  std::vector<std::size_t> edge_inputs;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    const InputSpec& spec = c.inputs[i];
    const DType dt = spec.dtype.value_or(c.dtype);
    const bool own = spec.low < spec.high;
    const consistency::ViewPlan plan = consistency::view_plan(spec);
    Input in{
        consistency::random_tensor(plan.base, dt, own ? spec.low : op.test.low, own ? spec.high : op.test.high, gen),
        plan, spec.layout != Layout::contiguous && !spec.shape.empty()};
    if (c.values != Values::random && takes_edges(spec) && dt != DType::boolean) {
      in.edge = true;
      const std::size_t k = edge_inputs.size();
      edge_inputs.push_back(i);
      const std::int64_t n = in.base.numel();
      const std::int64_t cols = plan.base.size() == 2 ? plan.base[1] : 1;
      // Grid: input 0 varies by row, input 1 by column, others along the diagonals.
      auto pick = [&](std::int64_t j, std::size_t count) -> std::int64_t {
        if (c.values == Values::edge_sparse) return (j % 3 == static_cast<std::int64_t>(k % 3)) ? (j / 3) % count : -1;
        const std::int64_t r = j / cols, q = j % cols;
        return (k == 0 ? r : k == 1 ? q : r + q) % static_cast<std::int64_t>(count);
      };
      if (kiln::is_floating(dt)) {
        std::vector<double> v = in.base.to_vector<double>(), e = float_edges(dt);
        for (std::int64_t j = 0; j < n; ++j)
          if (std::int64_t p = pick(j, e.size()); p >= 0)
            v[static_cast<std::size_t>(j)] = e[static_cast<std::size_t>(p)];
        in.base = kiln::from_vector(v, plan.base, {.dtype = dt});
      } else {
        std::vector<std::int64_t> v = in.base.to_vector<std::int64_t>(), e = int_edges(dt);
        for (std::int64_t j = 0; j < n; ++j)
          if (std::int64_t p = pick(j, e.size()); p >= 0)
            v[static_cast<std::size_t>(j)] = e[static_cast<std::size_t>(p)];
        in.base = kiln::from_vector(v, plan.base, {.dtype = dt});
      }
    }
    out.push_back(in);
  }
  return out;
}

}  // namespace difftest
