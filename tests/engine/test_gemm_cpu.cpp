// cpu::gemm, its blocked loop and its OpenBLAS path against a naive triple loop in double
// (exact modular arithmetic for the integers), over every dtype and operand layout.
#include <doctest/doctest.h>

#include "element_bytes.h"
#include "matrix_layout.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/cpu/gemm_cpu.h"
#include "kiln/error.h"
#include "kiln/half.h"

using namespace kiln;
using cpu::GemmShape;

namespace {

using kiln_test::Layout;
using kiln_test::layout_name;

std::string num(double v) {
  std::ostringstream o;
  o.precision(9);
  o << v;
  return o.str();
}

// A batch of matrices of one dtype in host memory, including the gaps between elements.
struct Mat {
  DType dt;
  std::int64_t batch, rows, cols, bs = 0, rs = 0, cs = 1;
  std::vector<unsigned char> bytes;

  Mat(DType d, std::int64_t batch_, std::int64_t r, std::int64_t c, Layout l, bool broadcast)
      : dt(d), batch(batch_), rows(r), cols(c) {
    const kiln_test::MatrixStrides m = kiln_test::matrix_strides(l, batch_, r, c, broadcast, 3);
    bs = m.bs, rs = m.rs, cs = m.cs;
    bytes.resize(static_cast<std::size_t>(m.elements) * dtype_size(d));
  }
  std::int64_t elems() const { return static_cast<std::int64_t>(bytes.size() / dtype_size(dt)); }
  std::int64_t at(std::int64_t b, std::int64_t i, std::int64_t j) const { return b * bs + i * rs + j * cs; }
  double get(std::int64_t e) const { return kiln_test::get_element(dt, bytes.data(), e); }
  std::int64_t get_int(std::int64_t e) const {
    const void* p = bytes.data() + e * static_cast<std::int64_t>(dtype_size(dt));
    return dt == DType::i32 ? *static_cast<const std::int32_t*>(p) : *static_cast<const std::int64_t*>(p);
  }
  void set(std::int64_t e, double v) { kiln_test::set_element(dt, bytes.data(), e, v); }
  // Uniform in [-1, 1] for floats, small integers for integers; the gaps get values too.
  void fill_random(std::mt19937& rng) {
    std::uniform_real_distribution<double> u(-1, 1);
    std::uniform_int_distribution<int> k(-9, 9);
    for (std::int64_t e = 0; e < elems(); ++e) set(e, is_integral(dt) ? k(rng) : u(rng));
  }
  cpu::GemmOperand in() const { return {bytes.data(), bs, rs, cs}; }
  cpu::GemmOutput out() { return {bytes.data(), bs, rs, cs}; }
};

// Rounding unit of the output type and of the accumulation (f16/bf16 accumulate in f32).
double unit_out(DType d) {
  return d == DType::f64 ? 0x1p-53 : d == DType::f16 ? 0x1p-11 : d == DType::bf16 ? 0x1p-8 : 0x1p-24;
}
double unit_acc(DType d) { return d == DType::f64 ? 0x1p-53 : 0x1p-24; }

// Compares `got` (C after the call) with the naive product of a, b and the C before it
// (`c0`). Floats: within the summation error bound (k+2)*u_acc*sum|terms| plus one rounding
// to the output type; integers: exactly, modulo 2^bits. Gaps between C's elements must be
// untouched. Returns "" or the first mismatches.
std::string compare(const Mat& a, const Mat& b, const Mat& c0, const Mat& got, const GemmShape& s, double alpha,
                    double beta) {
  std::ostringstream err;
  int bad = 0;
  std::vector<bool> is_elem(static_cast<std::size_t>(got.elems()));
  for (std::int64_t bi = 0; bi < s.batch; ++bi)
    for (std::int64_t i = 0; i < s.m; ++i)
      for (std::int64_t j = 0; j < s.n; ++j) {
        const std::int64_t e = got.at(bi, i, j);
        is_elem[static_cast<std::size_t>(e)] = true;
        bool ok;
        std::string want_text, got_text;
        if (is_integral(got.dt)) {
          std::uint64_t acc = 0;
          for (std::int64_t p = 0; p < s.k; ++p)
            acc += static_cast<std::uint64_t>(a.get_int(a.at(bi, i, p))) *
                   static_cast<std::uint64_t>(b.get_int(b.at(bi, p, j)));
          std::uint64_t want = static_cast<std::uint64_t>(static_cast<std::int64_t>(alpha)) * acc;
          if (beta != 0)
            want +=
                static_cast<std::uint64_t>(static_cast<std::int64_t>(beta)) * static_cast<std::uint64_t>(c0.get_int(e));
          const std::int64_t w = got.dt == DType::i32 ? static_cast<std::int32_t>(static_cast<std::uint32_t>(want))
                                                      : static_cast<std::int64_t>(want);
          ok = got.get_int(e) == w;
          want_text = std::to_string(w), got_text = std::to_string(got.get_int(e));
        } else {
          double sum = 0, mag = 0;
          for (std::int64_t p = 0; p < s.k; ++p) {
            const double t = a.get(a.at(bi, i, p)) * b.get(b.at(bi, p, j));
            sum += t, mag += std::fabs(t);
          }
          double want = alpha * sum, scale = std::fabs(alpha) * mag;
          if (beta != 0) want += beta * c0.get(e), scale += std::fabs(beta * c0.get(e));
          const double tol = 2 * ((s.k + 2) * unit_acc(got.dt) * scale + unit_out(got.dt) * std::fabs(want));
          const double v = got.get(e);
          ok = std::fabs(v - want) <= tol;
          want_text = num(want) + " +- " + num(tol), got_text = num(v);
        }
        if (!ok && bad++ < 5)
          err << "  C[" << bi << "," << i << "," << j << "] = " << got_text << ", want " << want_text << "\n";
      }
  for (std::int64_t e = 0; e < got.elems(); ++e)
    if (!is_elem[static_cast<std::size_t>(e)] && got.get(e) != c0.get(e) && bad++ < 5)
      err << "  gap element " << e << " of C was written\n";
  if (bad) err << "  " << bad << " mismatches\n";
  return err.str();
}

using GemmFn = void (*)(DType, const GemmShape&, double, const cpu::GemmOperand&, const cpu::GemmOperand&, double,
                        const cpu::GemmOutput&);

struct Case {
  GemmShape s;
  Layout la, lb, lc;
  bool bcast_a = false, bcast_b = false;
  double alpha = 1, beta = 0;
};

std::string case_name(const char* impl, DType d, const Case& c) {
  std::ostringstream o;
  o << impl << "(dtype=" << dtype_name(d) << ", bmnk=[" << c.s.batch << "," << c.s.m << "," << c.s.n << "," << c.s.k
    << "], a=" << layout_name(c.la) << (c.bcast_a ? "*" : "") << ", b=" << layout_name(c.lb) << (c.bcast_b ? "*" : "")
    << ", c=" << layout_name(c.lc) << ", alpha=" << c.alpha << ", beta=" << c.beta << ")";
  return o.str();
}

// Runs one case through `fn` and checks it against the naive loop.
void check_case(const char* impl, GemmFn fn, DType d, Case c, std::uint32_t seed) {
  if (is_integral(d)) c.alpha = std::round(2 * c.alpha), c.beta = std::round(2 * c.beta);  // integers only
  std::mt19937 rng(seed);
  Mat a(d, c.s.batch, c.s.m, c.s.k, c.la, c.bcast_a), b(d, c.s.batch, c.s.k, c.s.n, c.lb, c.bcast_b);
  Mat cm(d, c.s.batch, c.s.m, c.s.n, c.lc, false);
  a.fill_random(rng), b.fill_random(rng), cm.fill_random(rng);
  const Mat c0 = cm;
  fn(d, c.s, c.alpha, a.in(), b.in(), c.beta, cm.out());
  const std::string report = compare(a, b, c0, cm, c.s, c.alpha, c.beta);
  INFO(case_name(impl, d, c) << "\n" << report);
  CHECK(report.empty());
}

const DType kAllGemmDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64};
const DType kFloatDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

// Every layout pair on small and odd shapes, plus shapes that cross every cache block edge.
std::vector<Case> layout_cases() {
  std::vector<Case> cases;
  const Layout all[] = {Layout::N, Layout::T, Layout::P, Layout::S};
  for (GemmShape s : {GemmShape{1, 1, 1, 1}, GemmShape{1, 37, 53, 29}, GemmShape{3, 5, 7, 11}})
    for (Layout la : all)
      for (Layout lb : all)
        for (Layout lc : {Layout::N, Layout::T, Layout::S}) cases.push_back({s, la, lb, lc});
  const GemmShape big{2, 67, 261, 259};
  cases.push_back({big, Layout::N, Layout::N, Layout::N});
  cases.push_back({big, Layout::T, Layout::T, Layout::T, false, false, 0.5, -1.5});
  cases.push_back({big, Layout::S, Layout::P, Layout::N, false, false, 1, 1});
  cases.push_back({{4, 9, 6, 13}, Layout::N, Layout::T, Layout::N, true, false, -2, 0});
  cases.push_back({{4, 9, 6, 13}, Layout::T, Layout::N, Layout::T, false, true, 1, 3});
  cases.push_back({{3, 33, 17, 70}, Layout::S, Layout::N, Layout::P, true, true, 1.25, 0.5});
  return cases;
}

// K = 0 and alpha = 0 leave beta * C; the NaN planted in A must not reach C.
std::vector<Case> degenerate_cases() {
  return {{{2, 5, 7, 0}, Layout::N, Layout::N, Layout::N, false, false, 1, 0},
          {{2, 5, 7, 0}, Layout::N, Layout::N, Layout::T, false, false, 1, 1},
          {{2, 5, 7, 0}, Layout::N, Layout::N, Layout::S, false, false, 1, 2.5},
          {{2, 5, 7, 3}, Layout::N, Layout::N, Layout::N, false, false, 0, -2},
          {{0, 5, 7, 3}, Layout::N, Layout::N, Layout::N},
          {{2, 0, 7, 3}, Layout::N, Layout::N, Layout::N},
          {{2, 5, 0, 3}, Layout::N, Layout::N, Layout::N}};
}

}  // namespace

TEST_CASE("gemm layout: unit stride on either axis maps to BLAS, anything else needs a copy") {
  using cpu::blas_operand;
  auto n = blas_operand(3, 4, 4, 1);
  REQUIRE(n);
  CHECK_FALSE(n->trans);
  CHECK(n->ld == 4);
  auto t = blas_operand(3, 4, 1, 5);  // a transposed view with padding
  REQUIRE(t);
  CHECK(t->trans);
  CHECK(t->ld == 5);
  CHECK_FALSE(blas_operand(3, 4, 8, 2));  // no unit stride
  CHECK_FALSE(blas_operand(3, 4, 0, 1));  // broadcast rows overlap
  CHECK_FALSE(blas_operand(3, 4, 2, 1));  // rows overlap
  CHECK_FALSE(blas_operand(3, 4, -4, 1));
  auto row = blas_operand(1, 4, 0, 3);  // a single row with col stride 3 is a column-major 1x4
  REQUIRE(row);
  CHECK(row->trans);
  CHECK(row->ld == 3);
  auto one = blas_operand(1, 1, 7, 9);
  REQUIRE(one);
  CHECK(one->ld == 1);

  auto g = cpu::blas_gemm(2, 3, 5, 5, 1, 3, 1, 3, 1);  // all row-major
  REQUIRE(g);
  CHECK_FALSE(g->swap_ab);
  CHECK(g->m == 2);
  auto gt = cpu::blas_gemm(2, 3, 5, 5, 1, 3, 1, 1, 2);  // C column-major: C^T = B^T A^T
  REQUIRE(gt);
  CHECK(gt->swap_ab);
  CHECK(gt->m == 3);
  CHECK(gt->n == 2);
  CHECK(gt->a.trans);  // B^T of a row-major B is column-major
  CHECK(gt->c.ld == 2);
  CHECK_FALSE(cpu::blas_gemm(2, 3, 5, 5, 1, 3, 1, 6, 2));
}

TEST_CASE("gemm_blocked matches a naive loop for every dtype and layout") {
  std::uint32_t seed = 1;
  for (DType d : kAllGemmDTypes)
    for (const Case& c : layout_cases()) check_case("gemm_blocked", cpu::gemm_blocked, d, c, seed++);
}

TEST_CASE("gemm (OpenBLAS where it applies) matches a naive loop for every dtype and layout") {
  std::uint32_t seed = 1000;
  for (DType d : kAllGemmDTypes)
    for (const Case& c : layout_cases()) check_case("gemm", cpu::gemm, d, c, seed++);
}

TEST_CASE("gemm_blas takes unit-stride layouts and declines the rest") {
  if (!cpu::have_blas()) {
    MESSAGE("built without OpenBLAS: gemm_blas always declines");
    float x = 1;
    CHECK_FALSE(cpu::gemm_blas(DType::f32, {1, 1, 1, 1}, 1, {&x, 0, 1, 1}, {&x, 0, 1, 1}, 0, {&x, 0, 1, 1}));
    return;
  }
  auto blas = [](DType d, const GemmShape& s, double al, const cpu::GemmOperand& a, const cpu::GemmOperand& b,
                 double be, const cpu::GemmOutput& c) { REQUIRE(cpu::gemm_blas(d, s, al, a, b, be, c)); };
  std::uint32_t seed = 2000;
  for (DType d : kFloatDTypes)
    for (const Case& c : layout_cases()) {
      Mat a(d, c.s.batch, c.s.m, c.s.k, c.la, false), b(d, c.s.batch, c.s.k, c.s.n, c.lb, false);
      Mat cm(d, c.s.batch, c.s.m, c.s.n, c.lc, false);
      const bool copies = !cpu::blas_gemm(c.s.m, c.s.n, c.s.k, a.rs, a.cs, b.rs, b.cs, cm.rs, cm.cs);
      CHECK(copies == (c.s.m > 1 && (c.la == Layout::S || c.lb == Layout::S || c.lc == Layout::S)));
      if (copies && (d == DType::f32 || d == DType::f64)) {
        const auto before = cm.bytes;
        INFO(case_name("gemm_blas", d, c));
        CHECK_FALSE(cpu::gemm_blas(d, c.s, c.alpha, a.in(), b.in(), c.beta, cm.out()));
        CHECK(cm.bytes == before);
      } else {
        check_case("gemm_blas", +blas, d, c, seed++);  // f16/bf16 go through f32 copies
      }
    }
  float x = 1;
  CHECK_FALSE(cpu::gemm_blas(DType::i32, {1, 1, 1, 1}, 1, {&x, 0, 1, 1}, {&x, 0, 1, 1}, 0, {&x, 0, 1, 1}));
}

TEST_CASE("gemm with K = 0, alpha = 0 or an empty output leaves beta * C") {
  std::uint32_t seed = 3000;
  for (DType d : kAllGemmDTypes)
    for (const Case& c : degenerate_cases()) {
      check_case("gemm", cpu::gemm, d, c, seed);
      check_case("gemm_blocked", cpu::gemm_blocked, d, c, seed++);
    }
  // NaN in A with alpha = 0, and NaN in C with beta = 0, stay out of the result.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType d : kFloatDTypes)
    for (GemmFn fn : {GemmFn(cpu::gemm), GemmFn(cpu::gemm_blocked)}) {
      Mat a(d, 1, 2, 3, Layout::N, false), b(d, 1, 3, 2, Layout::N, false), c(d, 1, 2, 2, Layout::N, false);
      for (std::int64_t e = 0; e < 6; ++e) a.set(e, nan), b.set(e, 1);
      for (std::int64_t e = 0; e < 4; ++e) c.set(e, 2);
      fn(d, {1, 2, 2, 3}, 0, a.in(), b.in(), 0.5, c.out());
      for (std::int64_t e = 0; e < 4; ++e) CHECK(c.get(e) == 1);
      for (std::int64_t e = 0; e < 6; ++e) a.set(e, 1);
      for (std::int64_t e = 0; e < 4; ++e) c.set(e, nan);
      fn(d, {1, 2, 2, 3}, 1, a.in(), b.in(), 0, c.out());
      for (std::int64_t e = 0; e < 4; ++e) CHECK(c.get(e) == 3);
    }
}

TEST_CASE("integer gemm wraps modulo 2^bits exactly") {
  for (DType d : {DType::i32, DType::i64}) {
    Mat a(d, 1, 3, 5, Layout::N, false), b(d, 1, 5, 4, Layout::T, false), c(d, 1, 3, 4, Layout::N, false);
    std::mt19937_64 rng(7);
    const std::int64_t big = d == DType::i32 ? (std::int64_t{1} << 30) : (std::int64_t{1} << 62);
    std::uniform_int_distribution<std::int64_t> u(-big, big);
    // Values past 2^53 do not survive `set`'s double: write them as integers.
    auto put = [&](Mat& m) {
      for (std::int64_t e = 0; e < m.elems(); ++e) {
        const std::int64_t v = u(rng);
        if (d == DType::i32)
          reinterpret_cast<std::int32_t*>(m.bytes.data())[e] = static_cast<std::int32_t>(v);
        else
          reinterpret_cast<std::int64_t*>(m.bytes.data())[e] = v;
      }
    };
    put(a), put(b), put(c);
    for (GemmFn fn : {GemmFn(cpu::gemm), GemmFn(cpu::gemm_blocked)}) {
      Mat out = c;
      fn(d, {1, 3, 4, 5}, 3, a.in(), b.in(), -7, out.out());
      const std::string report = compare(a, b, c, out, {1, 3, 4, 5}, 3, -7);
      INFO(dtype_name(d) << "\n" << report);
      CHECK(report.empty());
    }
  }
}

TEST_CASE("gemm rejects bad input with typed errors") {
  float x[4] = {};
  const cpu::GemmOperand in{x, 0, 1, 1};
  const cpu::GemmOutput out{x, 0, 1, 1};
  for (GemmFn fn : {GemmFn(cpu::gemm), GemmFn(cpu::gemm_blocked)}) {
    CHECK_THROWS_AS(fn(DType::u8, {1, 1, 1, 1}, 1, in, in, 0, out), DTypeError);
    CHECK_THROWS_AS(fn(DType::boolean, {1, 1, 1, 1}, 1, in, in, 0, out), DTypeError);
    CHECK_THROWS_AS(fn(DType::f32, {1, -1, 1, 1}, 1, in, in, 0, out), ShapeError);
    CHECK_THROWS_AS(fn(DType::f32, {2, 1, 1, 1}, 1, in, in, 0, out), ValueError);  // C broadcast over 2
    CHECK_THROWS_AS(fn(DType::i32, {1, 1, 1, 1}, 0.5, in, in, 0, out), ValueError);
    try {
      fn(DType::u8, {1, 1, 1, 1}, 1, in, in, 0, out);
    } catch (const DTypeError& e) {
      CHECK(std::string(e.what()).rfind("[gemm]", 0) == 0);
    }
  }
}
