// The reduction kernels on a real GPU against host references written independently
// (plain loops in double, exact integers for integer results): every reduce spec and dtype
// tuple over row, column and split layouts, NaN/Inf rows, empty reductions, and the
// launch plans. A failing case prints its name and the first mismatches with indices.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/reduce_kernels.h"
#include "kiln/error.h"
#include "kiln/half.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/memory.h"
#include "test_values.h"

using namespace kiln;
using kiln::kernels::launch_reduce;

namespace {

using kiln_test::kInf;
using kiln_test::kNaN;

struct Shape3 {
  std::int64_t outer, r, inner;
};

// ---- host encoding: values are kept as the doubles the dtype actually stores
double quantize(DType t, double v) {
  switch (t) {
    case DType::f32: return static_cast<float>(v);
    case DType::f16: return half_bits_to_float(float_to_half_bits(static_cast<float>(v)));
    case DType::bf16: return bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(v)));
    case DType::i32: return static_cast<std::int32_t>(v);
    case DType::i64: return static_cast<double>(static_cast<std::int64_t>(v));
    case DType::u8: return static_cast<std::uint8_t>(v);
    case DType::boolean: return v != 0 ? 1 : 0;
    default: return v;
  }
}

template <class T> void put(std::vector<std::uint8_t>& b, std::size_t i, T v) { std::memcpy(&b[i * sizeof(T)], &v, sizeof(T)); }
template <class T> T get(const std::vector<std::uint8_t>& b, std::size_t i) {
  T v;
  std::memcpy(&v, &b[i * sizeof(T)], sizeof(T));
  return v;
}

std::vector<std::uint8_t> encode(DType t, const std::vector<double>& v) {
  std::vector<std::uint8_t> b(v.size() * dtype_size(t));
  for (std::size_t i = 0; i < v.size(); ++i) {
    switch (t) {
      case DType::f32: put(b, i, static_cast<float>(v[i])); break;
      case DType::f64: put(b, i, v[i]); break;
      case DType::f16: put(b, i, float_to_half_bits(static_cast<float>(v[i]))); break;
      case DType::bf16: put(b, i, float_to_bf16_bits(static_cast<float>(v[i]))); break;
      case DType::i32: put(b, i, static_cast<std::int32_t>(v[i])); break;
      case DType::i64: put(b, i, static_cast<std::int64_t>(v[i])); break;
      case DType::u8: put(b, i, static_cast<std::uint8_t>(v[i])); break;
      case DType::boolean: put(b, i, static_cast<std::uint8_t>(v[i] != 0)); break;
    }
  }
  return b;
}

// Integer outputs are read exactly; float outputs as double.
struct Value {
  double d = 0;
  std::int64_t i = 0;
};

Value decode(DType t, const std::vector<std::uint8_t>& b, std::size_t k) {
  switch (t) {
    case DType::f32: return {get<float>(b, k), 0};
    case DType::f64: return {get<double>(b, k), 0};
    case DType::f16: return {half_bits_to_float(get<std::uint16_t>(b, k)), 0};
    case DType::bf16: return {bf16_bits_to_float(get<std::uint16_t>(b, k)), 0};
    case DType::i32: return {0, get<std::int32_t>(b, k)};
    case DType::i64: return {0, get<std::int64_t>(b, k)};
    case DType::u8: return {0, get<std::uint8_t>(b, k)};
    case DType::boolean: return {0, get<std::uint8_t>(b, k) != 0};
  }
  return {};
}

// ---- the reference: one output from the r values it reduces
Value reference(const std::string& op, const std::vector<double>& xs, DType in, double correction) {
  const auto n = static_cast<std::int64_t>(xs.size());
  const bool ints = !is_floating(in);
  auto first_nan = std::find_if(xs.begin(), xs.end(), [](double x) { return std::isnan(x); });
  const bool any_nan = first_nan != xs.end();
  if (op == "sum" || op == "mean") {
    if (ints) {
      std::int64_t s = 0;
      for (double x : xs) s += static_cast<std::int64_t>(x);
      return {0, s};
    }
    double s = 0;
    for (double x : xs) s += x;
    return {op == "sum" ? s : s / static_cast<double>(n), 0};
  }
  if (op == "prod") {
    if (ints) {
      std::uint64_t p = 1;  // wraps like the kernel's i64 product
      for (double x : xs) p *= static_cast<std::uint64_t>(static_cast<std::int64_t>(x));
      return {0, static_cast<std::int64_t>(p)};
    }
    double p = 1;
    for (double x : xs) p *= x;
    return {p, 0};
  }
  if (op == "max" || op == "min") {
    if (any_nan) return {kNaN, 0};
    double m = op == "max" ? *std::max_element(xs.begin(), xs.end()) : *std::min_element(xs.begin(), xs.end());
    return {m, static_cast<std::int64_t>(m)};
  }
  if (op == "argmax" || op == "argmin") {
    if (any_nan) return {0, first_nan - xs.begin()};
    auto it = op == "argmax" ? std::max_element(xs.begin(), xs.end()) : std::min_element(xs.begin(), xs.end());
    return {0, it - xs.begin()};  // both return the first of equal extremes
  }
  if (op == "var" || op == "std") {
    double mean = 0, ss = 0;
    for (double x : xs) mean += x;
    mean /= static_cast<double>(n);
    for (double x : xs) ss += (x - mean) * (x - mean);
    double v = ss / std::max(0.0, static_cast<double>(n) - correction);
    return {op == "var" ? v : std::sqrt(v), 0};
  }
  if (op == "logsumexp") {
    if (any_nan) return {kNaN, 0};
    double m = n ? *std::max_element(xs.begin(), xs.end()) : -kInf;
    if (std::isinf(m)) return {m, 0};
    double s = 0;
    for (double x : xs) s += std::exp(x - m);
    return {m + std::log(s), 0};
  }
  FAIL("no reference for op " << op);
  return {};
}

// ---- tolerances: accumulation error (f32 or f64 accumulator) plus rounding to the output.
double acc_eps(DType in) { return in == DType::f64 ? 0x1p-52 : 0x1p-23; }
double out_eps(DType out) {
  switch (out) {
    case DType::f16: return 0x1p-11;
    case DType::bf16: return 0x1p-8;
    case DType::f32: return 0x1p-24;
    default: return 0x1p-53;
  }
}

struct Stats {
  double abs_sum = 0, sq_sum = 0, sq_dev = 0;  // sums of |x|, x^2 and (x - mean)^2
};

Stats stats(const std::vector<double>& xs) {
  Stats st;
  double sum = 0;
  for (double x : xs) sum += x, st.abs_sum += std::abs(x), st.sq_sum += x * x;
  const double mean = sum / static_cast<double>(std::max<std::size_t>(xs.size(), 1));
  for (double x : xs) st.sq_dev += (x - mean) * (x - mean);
  return st;
}

// Bound on |got - ref| for a float output: the accumulator's error, scaled by what the
// op's error grows with (sum of |x|, the condition number of var), plus one rounding
// to the output dtype.
double tolerance(const std::string& op, DType in, DType out, double ref, const Stats& st, std::int64_t r) {
  const double e = acc_eps(in), n = static_cast<double>(std::max<std::int64_t>(r, 1));
  double acc = 0;  // max and min are exact
  if (op == "sum") acc = 64 * e * st.abs_sum;
  if (op == "mean") acc = 64 * e * st.abs_sum / n;
  if (op == "prod") acc = 16 * e * std::sqrt(n) * std::abs(ref);
  if (op == "var" || op == "std") acc = 16 * e * (st.sq_dev > 0 ? st.sq_sum / st.sq_dev : 1) * std::abs(ref);
  if (op == "logsumexp") acc = 64 * e * std::max(1.0, std::abs(ref));
  return acc + 1.01 * out_eps(out) * (std::abs(ref) + acc) + (out == DType::f16 ? 0x1p-24 : 0);
}

// ---- inputs shaped to each op: products near 1, variances off-centre, integers that wrap
std::vector<double> make_input(const std::string& op, DType t, std::int64_t count, std::int64_t r, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(static_cast<std::size_t>(count));
  const double rr = static_cast<double>(std::max<std::int64_t>(r, 1));
  for (auto& x : v) {
    if (is_floating(t)) {
      // Factors clustered at 1 make float products drift (near-ties at the binade edge round
      // one way), so most factors are +-1 exactly; a lost -1 still flips the sign.
      if (op == "prod")
        x = (rng() & 1 ? 1 : -1) * (u(rng) < 128 / rr - 1 ? std::exp(0.5 * u(rng)) : 1.0);
      else if (op == "var" || op == "std")
        x = 10 + u(rng);
      else if (op == "logsumexp")
        x = 10 * u(rng);
      else
        x = u(rng);
    } else if (t == DType::boolean) {
      double p_one = op == "prod" ? 1 - 0.5 / rr : op == "max" || op == "min" ? 1 / rr : 0.5;
      x = std::uniform_real_distribution<double>(0, 1)(rng) < p_one;
    } else if (op == "prod") {
      static constexpr double kOdd[] = {-3, -1, 1, 3}, kOddU8[] = {1, 3, 5, 255};
      x = (t == DType::u8 ? kOddU8 : kOdd)[rng() % 4];  // odd factors never wrap to zero
    } else if (t == DType::u8) {
      x = static_cast<double>(rng() % 256);
    } else {
      double span = op == "sum" || op == "mean" ? 100 : t == DType::i32 ? 1e9 : 1e15;
      x = std::round(u(rng) * span);
    }
    x = quantize(t, x);
  }
  return v;
}

std::string case_name(const std::string& op, const DTypes& d, Shape3 s) {
  std::ostringstream o;
  o << op << "(in=" << dtype_name(d[0]) << ", out=" << dtype_name(d[1]) << ", [outer,r,inner]=[" << s.outer << ","
    << s.r << "," << s.inner << "])";
  return o.str();
}

double correction_for(const std::string& op) { return op == "var" ? 1.0 : 0.0; }  // std runs with 0

// Runs one reduction on the GPU and compares every output; returns the number of mismatches.
// offset: elements the input starts past a 256-byte aligned allocation.
int check_reduction(const rt::KernelSpec& spec, const DTypes& d, Shape3 s, const std::vector<double>& x,
                    std::size_t offset = 0) {
  const std::string& op = spec.op;
  const DType in = d[0], out = d[1];
  const double corr = correction_for(op);
  rt::Stream& stream = rt::default_stream(0);
  const std::vector<std::uint8_t> bytes = encode(in, x);
  const auto n_out = static_cast<std::size_t>(s.outer * s.inner);
  const std::size_t skip = offset * dtype_size(in);
  rt::DeviceBuffer din(bytes.size() + skip, stream), dout(n_out * dtype_size(out), stream);
  if (!bytes.empty()) rt::copy_to_device(din.ptr() + skip, bytes.data(), bytes.size(), stream);
  launch_reduce(spec, in, out, din.ptr() + skip, dout.ptr(), s.outer, s.r, s.inner, stream, corr);
  std::vector<std::uint8_t> got_bytes(n_out * dtype_size(out));
  rt::copy_to_host(got_bytes.data(), dout.ptr(), got_bytes.size(), stream);

  int bad = 0;
  double worst = 0;
  std::ostringstream report;
  std::vector<double> xs(static_cast<std::size_t>(s.r));
  for (std::int64_t o = 0; o < s.outer; ++o) {
    for (std::int64_t i = 0; i < s.inner; ++i) {
      for (std::int64_t k = 0; k < s.r; ++k)
        xs[static_cast<std::size_t>(k)] = x[static_cast<std::size_t>((o * s.r + k) * s.inner + i)];
      const Value want = reference(op, xs, in, corr);
      const Value got = decode(out, got_bytes, static_cast<std::size_t>(o * s.inner + i));
      bool ok;
      double err = 0, tol = 0;
      if (!is_floating(out)) {
        ok = got.i == want.i;
      } else {
        // got may also be the reference rounded to the output dtype (overflow to inf, underflow to 0).
        const double q = quantize(out, want.d);
        tol = tolerance(op, in, out, want.d, stats(xs), s.r);
        err = std::abs(got.d - want.d);
        ok = std::isnan(want.d) ? std::isnan(got.d) : got.d == q || err <= tol;
        if (ok && tol > 0) worst = std::max(worst, err / tol);
      }
      if (!ok && ++bad <= 5) {
        report << "\n  [o=" << o << ", i=" << i << "] got " << (is_floating(out) ? got.d : static_cast<double>(got.i))
               << ", want " << (is_floating(out) ? want.d : static_cast<double>(want.i));
        if (tol > 0) report << " (error " << err << " > tolerance " << tol << ")";
      }
    }
  }
  const std::string name = case_name(op, d, s) + (offset ? " at +" + std::to_string(offset) + " elements" : "");
  if (std::getenv("KILN_REDUCE_VERBOSE")) MESSAGE(name << ": worst error/tolerance " << worst);
  CHECK_MESSAGE(bad == 0, name << ": " << bad << " of " << n_out << " outputs differ; first:" << report.str());
  return bad;
}

const rt::KernelSpec& spec_of(std::string_view op) {
  const rt::KernelSpec* spec = rt::find_kernel(op);
  REQUIRE_MESSAGE(spec != nullptr, "no kernel spec registered for " << op);
  return *spec;
}

const std::vector<Shape3> kReduceShapes = {
    {1, 1, 1},     {1, 1000000, 1}, {37, 1001, 1}, {5, 333, 17},   {3, 7, 1},      {4096, 9, 1},
    {200, 40, 1},  {64, 5000, 1},   {3, 300001, 1}, {1, 100000, 4}, {3, 20000, 33}, {1000, 3, 5},
    {2, 1, 1000},  {1, 4096, 300},  {9000, 130, 1}, {2, 70000, 2},
};

void check_op(const std::string& op) {
  const rt::KernelSpec& spec = spec_of(op);
  for (const DTypes& d : spec.dtypes) {
    std::vector<Shape3> shapes = kReduceShapes;
    if (d[0] == DType::f32) shapes.push_back({1, std::int64_t{1} << 24, 1});
    std::uint64_t seed = 1;
    for (Shape3 s : shapes) check_reduction(spec, d, s, make_input(op, d[0], s.outer * s.r * s.inner, s.r, seed++));
  }
}

const char* const kOps[] = {"sum", "prod", "mean", "max", "min", "argmax", "argmin", "var", "std", "logsumexp"};

}  // namespace

TEST_CASE("reduce sum") { check_op("sum"); }
TEST_CASE("reduce prod") { check_op("prod"); }
TEST_CASE("reduce mean") { check_op("mean"); }
TEST_CASE("reduce max") { check_op("max"); }
TEST_CASE("reduce min") { check_op("min"); }
TEST_CASE("reduce argmax") { check_op("argmax"); }
TEST_CASE("reduce argmin") { check_op("argmin"); }
TEST_CASE("reduce var") { check_op("var"); }
TEST_CASE("reduce std") { check_op("std"); }
TEST_CASE("reduce logsumexp") { check_op("logsumexp"); }

TEST_CASE("reductions read inputs that start off a 16-byte boundary") {
  // Rows take a scalar head before their vector loads; columns fall back to scalar loads.
  for (const char* op : {"sum", "argmax", "var", "max"}) {
    const rt::KernelSpec& spec = spec_of(op);
    for (const DTypes& d : spec.dtypes) {
      std::uint64_t seed = 100;
      for (Shape3 s : {Shape3{3, 1001, 1}, Shape3{1, 100000, 1}, Shape3{2, 500, 8}, Shape3{5, 3000, 4}})
        for (std::size_t offset : {1, 3})
          check_reduction(spec, d, s, make_input(op, d[0], s.outer * s.r * s.inner, s.r, seed++), offset);
    }
  }
}

TEST_CASE("reductions treat NaN and Inf like PyTorch, in rows and in columns") {
  // Row k of [kRows, kR]: NaNs, infinities, all -inf, large values, ties.
  constexpr std::int64_t kRows = 8, kR = 1000;
  std::vector<double> rows(static_cast<std::size_t>(kRows * kR));
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-1, 1);
  // Magnitudes in [0.5, 1.5] keep partial products away from underflow, where inf * 0 would
  // make prod depend on the order.
  for (auto& x : rows) x = (rng() & 1 ? 1 : -1) * (1 + 0.5 * u(rng));
  auto at = [&](std::int64_t row, std::int64_t k) -> double& { return rows[static_cast<std::size_t>(row * kR + k)]; };
  at(0, 5) = kNaN, at(0, 700) = kNaN;
  at(1, 3) = kInf;
  at(2, 10) = -kInf, at(2, 20) = kInf;
  for (std::int64_t k = 0; k < kR; ++k) at(3, k) = -kInf, at(4, k) = 1000, at(6, k) = 0.5;
  at(5, kR - 1) = kNaN;
  at(7, 17) = -kInf;
  for (const char* op : kOps) {
    const rt::KernelSpec& spec = spec_of(op);
    for (const DTypes& d : spec.dtypes) {
      if (!is_floating(d[0])) continue;
      std::vector<double> x(rows.size()), cols(rows.size());
      for (std::size_t k = 0; k < rows.size(); ++k) x[k] = quantize(d[0], rows[k]);
      for (std::int64_t row = 0; row < kRows; ++row)
        for (std::int64_t k = 0; k < kR; ++k)
          cols[static_cast<std::size_t>(k * kRows + row)] = x[static_cast<std::size_t>(row * kR + k)];
      check_reduction(spec, d, {kRows, kR, 1}, x);
      check_reduction(spec, d, {1, kR, kRows}, cols);
    }
  }
}

TEST_CASE("reducing an empty dimension gives the identity or throws before launching") {
  rt::Stream& s = rt::default_stream(0);
  rt::DeviceBuffer out(7 * 3 * 8, s);
  for (const char* op : kOps) {
    const rt::KernelSpec& spec = spec_of(op);
    for (const DTypes& d : spec.dtypes) {
      CAPTURE(case_name(op, d, {7, 0, 3}));
      if (!kernels::reduce_has_identity(op)) {
        const std::string message = std::string("[").append(op).append("] cannot reduce an empty dimension");
        CHECK_THROWS_WITH_AS(launch_reduce(spec, d[0], d[1], 0, out.ptr(), 7, 0, 3, s),
                             doctest::Contains(message.c_str()), ValueError);
        continue;
      }
      check_reduction(spec, d, {7, 0, 3}, {});
    }
  }
  // No outputs: nothing to launch, and no error for ops with an identity.
  CHECK_NOTHROW(launch_reduce(spec_of("sum"), DType::f32, DType::f32, 0, 0, 0, 5, 3, s));
  CHECK_THROWS_AS(launch_reduce(spec_of("sum"), DType::f32, DType::f16, 0, out.ptr(), 1, 5, 1, s), DTypeError);
  CHECK_THROWS_AS(launch_reduce(spec_of("sum"), DType::f32, DType::f32, 0, out.ptr(), 1, -5, 1, s), ShapeError);
}

TEST_CASE("a split full reduction is deterministic") {
  const rt::KernelSpec& spec = spec_of("sum");
  rt::Stream& s = rt::default_stream(0);
  const std::int64_t n = std::int64_t{1} << 24;
  const std::vector<std::uint8_t> bytes = encode(DType::f32, make_input("sum", DType::f32, n, n, 3));
  rt::DeviceBuffer in(bytes.size(), s), out(8, s);
  rt::copy_to_device(in.ptr(), bytes.data(), bytes.size(), s);
  float first = 0, again = 0;
  launch_reduce(spec, DType::f32, DType::f32, in.ptr(), out.ptr(), 1, n, 1, s);
  rt::copy_to_host(&first, out.ptr(), 4, s);
  for (int k = 0; k < 3; ++k) {
    launch_reduce(spec, DType::f32, DType::f32, in.ptr(), out.ptr(), 1, n, 1, s);
    rt::copy_to_host(&again, out.ptr(), 4, s);
    CHECK(std::memcmp(&first, &again, 4) == 0);
  }
}

TEST_CASE("reduce plans cover r exactly and finish in two passes") {
  const int sms = rt::device_info(0).sm_count;
  for (std::int64_t outer : {1, 3, 37, 1000, 100000})
    for (std::int64_t r : {1, 2, 33, 1001, 65536, 300001, 1 << 24})
      for (std::int64_t inner : {1, 2, 17, 300})
        for (int vec : {1, 2, 4, 8, 16}) {
          INFO("outer=" << outer << " r=" << r << " inner=" << inner << " vec=" << vec);
          const auto p = kernels::plan_reduce(outer, r, inner, vec, sms);
          CHECK(p.blocks >= 1);
          CHECK(p.splits * p.chunk >= r);
          CHECK((p.splits - 1) * p.chunk < r);
          if (inner == 1) CHECK((p.lanes == 0 || (p.lanes <= 32 && (p.lanes & (p.lanes - 1)) == 0)));
          if (inner > 1) {
            CHECK((p.lanes >= 1 && p.lanes <= 32 && (p.lanes & (p.lanes - 1)) == 0));
            CHECK((p.lanes_r >= 1 && (p.lanes_r & (p.lanes_r - 1)) == 0 && p.lanes * p.lanes_r <= 256));
            CHECK(inner % p.col_vec == 0);
          }
          if (p.splits > 1) {
            CHECK(p.chunk % vec == 0);
            CHECK(kernels::plan_reduce(outer, p.splits, inner, 1, sms, false).splits == 1);
          }
        }
  // A 2^28-element sum spreads over at least a wave of blocks.
  const auto full = kernels::plan_reduce(1, std::int64_t{1} << 28, 1, 4, sms);
  CHECK(full.lanes == 0);
  CHECK(full.splits >= sms * 4);
}
