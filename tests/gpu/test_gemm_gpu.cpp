// kernels::gemm (cuBLAS) against cpu::gemm on the same data: every float dtype, transposed,
// padded and broadcast operands, the degenerate sizes, and a 512x768x1024 product per mode.
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

#include "backend/cuda/gemm.h"
#include "core/cpu/gemm_cpu.h"
#include "kiln/error.h"
#include "kiln/half.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/memory.h"

using namespace kiln;

namespace {

using MatrixLayout = kiln_test::Layout;
using kiln_test::layout_name;

// A batch of matrices in host memory (gaps included) and its copy on the device.
struct Mat {
  DType dt;
  std::int64_t rows, cols, bs = 0, rs = 0, cs = 1;
  std::vector<unsigned char> host;
  rt::DeviceBuffer dev;

  Mat(DType d, std::int64_t batch, std::int64_t r, std::int64_t c, MatrixLayout l, bool broadcast) : dt(d), rows(r), cols(c) {
    const kiln_test::MatrixStrides m = kiln_test::matrix_strides(l, batch, r, c, broadcast, 5);
    bs = m.bs, rs = m.rs, cs = m.cs;
    host.resize(static_cast<std::size_t>(m.elements) * dtype_size(d));
  }
  std::int64_t elems() const { return static_cast<std::int64_t>(host.size() / dtype_size(dt)); }
  std::int64_t at(std::int64_t b, std::int64_t i, std::int64_t j) const { return b * bs + i * rs + j * cs; }
  static double get(DType dt, const unsigned char* bytes, std::int64_t e) {
    return kiln_test::get_element(dt, bytes, e);
  }
  double get(std::int64_t e) const { return get(dt, host.data(), e); }
  void set(std::int64_t e, double v) { kiln_test::set_element(dt, host.data(), e, v); }
  void fill_random(std::mt19937& rng) {
    std::uniform_real_distribution<double> u(-1, 1);
    for (std::int64_t e = 0; e < elems(); ++e) set(e, u(rng));
  }
  void upload(const rt::Stream& s) {
    dev = rt::DeviceBuffer(host.size(), s);
    rt::copy_to_device(dev.ptr(), host.data(), host.size(), s);
  }
  std::vector<unsigned char> download(const rt::Stream& s) const {
    std::vector<unsigned char> out(host.size());
    rt::copy_to_host(out.data(), dev.ptr(), out.size(), s);
    return out;
  }
  kernels::GemmOperand gpu() const { return {dev.ptr(), bs, rs, cs}; }
  cpu::GemmOperand cpu_in() const { return {host.data(), bs, rs, cs}; }
  cpu::GemmOutput cpu_out() { return {host.data(), bs, rs, cs}; }
  bool layout_ok() const { return kernels::gemm_layout_ok(rows, cols, rs, cs); }
};

struct GemmCase {
  kernels::GemmShape s;
  MatrixLayout la = MatrixLayout::N, lb = MatrixLayout::N, lc = MatrixLayout::N;
  bool bcast_a = false, bcast_b = false;
  double alpha = 1, beta = 0;
};

std::string case_name(DType d, bool tf32, const GemmCase& c) {
  std::ostringstream o;
  o << "gemm(dtype=" << (tf32 ? "tf32" : std::string(dtype_name(d))) << ", bmnk=[" << c.s.batch << "," << c.s.m << ","
    << c.s.n << "," << c.s.k << "], a=" << layout_name(c.la) << (c.bcast_a ? "*" : "") << ", b=" << layout_name(c.lb)
    << (c.bcast_b ? "*" : "") << ", c=" << layout_name(c.lc) << ", alpha=" << c.alpha << ", beta=" << c.beta << ")";
  return o.str();
}

double rel_tolerance(DType d, bool tf32) {
  if (tf32) return 2e-3;
  switch (d) {
    case DType::f64:
      return 1e-12;
    case DType::f32:
      return 1e-5;
    case DType::f16:
      return 2e-3;
    default:
      return 1e-2;
  }
}

// ||gpu - cpu|| / ||cpu|| over C's elements; `report` gets the first mismatches and any
// written gap (an element between C's elements) or NaN disagreement.
double compare(const Mat& want, const std::vector<unsigned char>& got, const std::vector<unsigned char>& before,
               const kernels::GemmShape& s, double tol, std::string& report) {
  std::ostringstream err;
  err.precision(9);
  std::vector<bool> is_elem(static_cast<std::size_t>(want.elems()));
  double diff2 = 0, ref2 = 0;
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t i = 0; i < s.m; ++i)
      for (std::int64_t j = 0; j < s.n; ++j) {
        const std::int64_t e = want.at(b, i, j);
        is_elem[static_cast<std::size_t>(e)] = true;
        const double w = want.get(e), g = Mat::get(want.dt, got.data(), e);
        diff2 += (g - w) * (g - w), ref2 += w * w;
      }
  const double rms = std::sqrt(ref2 / std::max<double>(1, static_cast<double>(s.batch * s.m * s.n)));
  int shown = 0;
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t i = 0; i < s.m; ++i)
      for (std::int64_t j = 0; j < s.n; ++j) {
        const std::int64_t e = want.at(b, i, j);
        const double w = want.get(e), g = Mat::get(want.dt, got.data(), e);
        if (!(std::fabs(g - w) <= 8 * tol * std::max(std::fabs(w), rms)) && shown++ < 5)
          err << "  C[" << b << "," << i << "," << j << "]: gpu " << g << ", cpu " << w << "\n";
      }
  for (std::int64_t e = 0; e < want.elems(); ++e)
    if (!is_elem[static_cast<std::size_t>(e)] &&
        std::memcmp(&got[e * dtype_size(want.dt)], &before[e * dtype_size(want.dt)], dtype_size(want.dt)) != 0 &&
        shown++ < 5)
      err << "  gap element " << e << " of C was written\n";
  report = err.str();
  if (report.find("gap") != std::string::npos) return std::numeric_limits<double>::infinity();
  return ref2 == 0 ? std::sqrt(diff2) : std::sqrt(diff2 / ref2);
}

// Turns TF32 on for a scope.
struct Tf32Scope {
  explicit Tf32Scope(bool on) { kernels::set_allow_tf32(on); }
  ~Tf32Scope() { kernels::set_allow_tf32(false); }
};

// Runs one case on both devices and checks the GPU result; returns the relative error
// (NaN when cuBLAS was asked to decline the layout).
double check_case(DType d, const GemmCase& c, std::uint32_t seed, bool tf32 = false) {
  const rt::Stream& s = rt::default_stream(0);
  std::mt19937 rng(seed);
  Mat a(d, c.s.batch, c.s.m, c.s.k, c.la, c.bcast_a), b(d, c.s.batch, c.s.k, c.s.n, c.lb, c.bcast_b);
  Mat cm(d, c.s.batch, c.s.m, c.s.n, c.lc, false);
  a.fill_random(rng), b.fill_random(rng), cm.fill_random(rng);
  a.upload(s), b.upload(s), cm.upload(s);
  const auto before = cm.host;
  INFO(case_name(d, tf32, c));

  bool ran;
  {
    Tf32Scope scope(tf32);
    ran = kernels::gemm(d, c.s, c.alpha, a.gpu(), b.gpu(), c.beta, cm.gpu(), s);
  }
  const auto got = cm.download(s);
  // cuBLAS declines layouts without a unit stride; K == 0 or alpha == 0 only needs C's.
  const bool empty = c.s.batch == 0 || c.s.m == 0 || c.s.n == 0;
  const bool scale_only = c.s.k == 0 || c.alpha == 0;
  const bool expect_run = empty || (scale_only ? cm.layout_ok() : a.layout_ok() && b.layout_ok() && cm.layout_ok());
  CHECK(ran == expect_run);
  if (!expect_run) {
    CHECK(got == before);  // declined: nothing enqueued
    return std::numeric_limits<double>::quiet_NaN();
  }
  cpu::gemm(d, {c.s.batch, c.s.m, c.s.n, c.s.k}, c.alpha, a.cpu_in(), b.cpu_in(), c.beta, cm.cpu_out());
  std::string report;
  const double tol = rel_tolerance(d, tf32);
  const double err = compare(cm, got, before, c.s, tol, report);
  INFO("relative error " << err << " (tolerance " << tol << ")\n" << report);
  CHECK(err <= tol);
  return err;
}

const DType kGemmDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

}  // namespace

TEST_CASE("gemm on the GPU matches the CPU for every dtype and layout") {
  const MatrixLayout all[] = {MatrixLayout::N, MatrixLayout::T, MatrixLayout::P, MatrixLayout::S};
  std::uint32_t seed = 1;
  for (DType d : kGemmDTypes)
    for (kernels::GemmShape s :
         {kernels::GemmShape{1, 1, 1, 1}, kernels::GemmShape{1, 37, 53, 29}, kernels::GemmShape{3, 5, 7, 11}})
      for (MatrixLayout la : all)
        for (MatrixLayout lb : all)
          for (MatrixLayout lc : {MatrixLayout::N, MatrixLayout::T, MatrixLayout::S})
            check_case(d, {s, la, lb, lc, false, false, 1, 0}, seed++);
}

TEST_CASE("gemm on the GPU broadcasts operands over the batch and applies alpha and beta") {
  std::uint32_t seed = 500;
  for (DType d : kGemmDTypes) {
    check_case(d, {{4, 9, 6, 13}, MatrixLayout::N, MatrixLayout::T, MatrixLayout::N, true, false, -2, 0}, seed++);
    check_case(d, {{4, 9, 6, 13}, MatrixLayout::T, MatrixLayout::N, MatrixLayout::T, false, true, 1, 3}, seed++);
    check_case(d, {{3, 33, 17, 70}, MatrixLayout::P, MatrixLayout::T, MatrixLayout::P, true, true, 1.25, 0.5}, seed++);
    check_case(d, {{2, 67, 261, 259}, MatrixLayout::T, MatrixLayout::T, MatrixLayout::T, false, false, 0.5, -1.5}, seed++);
  }
}

TEST_CASE("gemm on the GPU with K = 0, alpha = 0 or an empty output leaves beta * C") {
  std::uint32_t seed = 700;
  for (DType d : kGemmDTypes) {
    check_case(d, {{2, 5, 7, 0}, MatrixLayout::N, MatrixLayout::N, MatrixLayout::N, false, false, 1, 0}, seed++);
    check_case(d, {{2, 5, 7, 0}, MatrixLayout::N, MatrixLayout::N, MatrixLayout::T, false, false, 1, 1}, seed++);
    check_case(d, {{2, 5, 7, 0}, MatrixLayout::N, MatrixLayout::N, MatrixLayout::P, false, false, 1, 2.5}, seed++);
    check_case(d, {{2, 5, 7, 3}, MatrixLayout::S, MatrixLayout::S, MatrixLayout::N, false, false, 0, -2}, seed++);  // A, B unread
    check_case(d, {{0, 5, 7, 3}}, seed++);
    check_case(d, {{2, 0, 7, 3}}, seed++);
    check_case(d, {{2, 5, 0, 3}}, seed++);

    // NaN in A with alpha = 0, and NaN in C with beta = 0, stay out of the result.
    const rt::Stream& s = rt::default_stream(0);
    const double nan = std::numeric_limits<double>::quiet_NaN();
    Mat a(d, 1, 2, 3, MatrixLayout::N, false), b(d, 1, 3, 2, MatrixLayout::N, false), c(d, 1, 2, 2, MatrixLayout::N, false);
    for (std::int64_t e = 0; e < 6; ++e) a.set(e, nan), b.set(e, 1);
    for (std::int64_t e = 0; e < 4; ++e) c.set(e, 2);
    a.upload(s), b.upload(s), c.upload(s);
    CHECK(kernels::gemm(d, {1, 2, 2, 3}, 0, a.gpu(), b.gpu(), 0.5, c.gpu(), s));
    auto got = c.download(s);
    for (std::int64_t e = 0; e < 4; ++e) CHECK(Mat::get(d, got.data(), e) == 1);
    for (std::int64_t e = 0; e < 6; ++e) a.set(e, 1);
    for (std::int64_t e = 0; e < 4; ++e) c.set(e, nan);
    a.upload(s), c.upload(s);
    CHECK(kernels::gemm(d, {1, 2, 2, 3}, 1, a.gpu(), b.gpu(), 0, c.gpu(), s));
    got = c.download(s);
    for (std::int64_t e = 0; e < 4; ++e) CHECK(Mat::get(d, got.data(), e) == 3);
  }
}

TEST_CASE("gemm on the GPU: 512x768x1024 in f32, TF32, f16, bf16 and f64") {
  const GemmCase big{{1, 512, 768, 1024}};
  const double f32_err = check_case(DType::f32, big, 900);
  const double tf32_err = check_case(DType::f32, big, 900, true);
  MESSAGE("512x768x1024 relative error: f32 " << f32_err << ", tf32 " << tf32_err);
  CHECK(tf32_err > 10 * f32_err);  // the flag really switched to TF32 tensor cores
  CHECK_FALSE(kernels::allow_tf32());
  for (DType d : {DType::f16, DType::bf16, DType::f64}) {
    const double err = check_case(d, big, 901);
    MESSAGE("512x768x1024 relative error: " << dtype_name(d) << " " << err);
  }
  // Transposed operands on the large size too: the cuBLAS call flips, nothing is copied.
  check_case(DType::f16, {{2, 512, 768, 1024}, MatrixLayout::T, MatrixLayout::T, MatrixLayout::N, false, true}, 902);
  check_case(DType::bf16, {{1, 512, 768, 1024}, MatrixLayout::N, MatrixLayout::T, MatrixLayout::T}, 903);
}

TEST_CASE("gemm on the GPU rejects bad input with typed errors") {
  const rt::Stream& s = rt::default_stream(0);
  rt::DeviceBuffer buf(64, s);
  const kernels::GemmOperand op{buf.ptr(), 0, 1, 1};
  CHECK_THROWS_AS((void)kernels::gemm(DType::i32, {1, 1, 1, 1}, 1, op, op, 0, op, s), DTypeError);
  CHECK_THROWS_AS((void)kernels::gemm(DType::u8, {1, 1, 1, 1}, 1, op, op, 0, op, s), DTypeError);
  CHECK_THROWS_AS((void)kernels::gemm(DType::f32, {1, 1, -1, 1}, 1, op, op, 0, op, s), ShapeError);
  CHECK_THROWS_AS((void)kernels::gemm(DType::f32, {2, 1, 1, 1}, 1, op, op, 0, op, s), ValueError);
}
