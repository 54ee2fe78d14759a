// The generated GEMM kernels (backend/cuda/generated/gemm) against a double-precision product
// of the same stored inputs, computed here: every arithmetic, every tile the tuner may pick,
// every epilogue, shapes with tails in m, n and k, a 10-wide output and padded row strides.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cuda/generated/gemm/gemm_plan.h"
#include "element_bytes.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/memory.h"

using namespace kiln;
using kernels::GemmEpilogue;
using kernels::GemmGeometry;
using kernels::GemmMath;

namespace {

struct HostMatrix {
  DType dt;
  std::int64_t rows, ld;
  std::vector<unsigned char> bytes;
  HostMatrix(DType d, std::int64_t r, std::int64_t l) : dt(d), rows(r), ld(l), bytes(r * l * dtype_size(d)) {}
  double at(std::int64_t i, std::int64_t j) const { return kiln_test::get_element(dt, bytes.data(), i * ld + j); }
  void set(std::int64_t i, std::int64_t j, double v) { kiln_test::set_element(dt, bytes.data(), i * ld + j, v); }
};

kernels::GemmTarget target() {
  const rt::DeviceInfo& info = rt::device_info(0);
  return {info.arch(), info.sm_count, info.max_shared_optin};
}

// Largest |got - want| over the largest |want|, NaNs required in the same places.
double check_launch(const kernels::GemmLaunch& l, std::uint32_t seed) {
  const GemmGeometry& g = l.g;
  const DType t = kernels::input_dtype(g.math);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  HostMatrix a(t, g.m, g.lda), b(t, g.n, g.ldb), d(t, g.m, g.ldd), bias(t, 1, g.n);
  for (std::int64_t i = 0; i < g.m; ++i)
    for (std::int64_t j = 0; j < g.lda; ++j) a.set(i, j, j < g.k ? u(rng) : 1e30);  // padding must stay unread
  for (std::int64_t i = 0; i < g.n; ++i)
    for (std::int64_t j = 0; j < g.ldb; ++j) b.set(i, j, j < g.k ? u(rng) : 1e30);
  for (std::int64_t j = 0; j < g.n; ++j) bias.set(0, j, u(rng));
  const rt::Stream& s = rt::default_stream(0);
  auto upload = [&](const HostMatrix& h) {
    rt::DeviceBuffer buf(h.bytes.size(), s);
    rt::copy_to_device(buf.ptr(), h.bytes.data(), h.bytes.size(), s);
    return buf;
  };
  rt::DeviceBuffer da = upload(a), db = upload(b), dd = upload(d), dbias = upload(bias);
  kernels::launch(l, {da.ptr(), db.ptr(), dd.ptr(), g.epilogue == GemmEpilogue::none ? 0 : dbias.ptr(), &s});
  rt::copy_to_host(d.bytes.data(), dd.ptr(), d.bytes.size(), s);
  s.synchronize();
  double worst = 0, scale = 0;
  for (std::int64_t i = 0; i < g.m; ++i)
    for (std::int64_t j = 0; j < g.n; ++j) {
      double want = 0;
      for (std::int64_t k = 0; k < g.k; ++k) want += a.at(i, k) * b.at(j, k);
      if (g.epilogue != GemmEpilogue::none) want += bias.at(0, j);
      if (g.epilogue == GemmEpilogue::relu_bias) want = std::max(want, 0.0);
      worst = std::max(worst, std::abs(d.at(i, j) - want));
      scale = std::max(scale, std::abs(want));
    }
  for (std::int64_t i = 0; i < g.m; ++i)  // the columns past n stay as they were
    for (std::int64_t j = g.n; j < g.ldd; ++j) REQUIRE(d.at(i, j) == 0);
  return worst / std::max(scale, 1e-30);
}

double tolerance(GemmMath m) { return m == GemmMath::bf16 ? 1.5e-2 : 4e-3; }

}  // namespace

TEST_CASE("generated GEMMs match a double-precision product in every arithmetic, tile and epilogue") {
  const kernels::GemmTarget tgt = target();
  if (tgt.arch != 90) {
    MESSAGE("the wgmma kernels need sm_90; this GPU is sm_" << tgt.arch);
    return;
  }
  struct Shape {
    std::int64_t m, n, k, pad_a, pad_d;
  };
  const Shape shapes[] = {{128, 128, 64, 0, 0},    // one tile, one k step
                          {520, 300, 264, 8, 3},   // tails in m, n and k; padded rows, odd ldd
                          {1024, 10, 4096, 0, 0},  // the wide MLP's output layer
                          {77, 200, 8, 0, 1}};     // k shorter than one k tile
  int runs = 0;
  for (GemmMath math : {GemmMath::bf16, GemmMath::f16, GemmMath::tf32})
    for (const Shape& sh : shapes)
      for (GemmEpilogue e : {GemmEpilogue::none, GemmEpilogue::bias, GemmEpilogue::relu_bias}) {
        const GemmGeometry g{sh.m, sh.n, sh.k, sh.k + sh.pad_a, sh.k, sh.n + sh.pad_d, math, e};
        const auto h = kernels::plan(kernels::GemmKernel::wgmma, g, tgt);
        REQUIRE(h);
        std::vector<kernels::GemmLaunch> launches{*h};
        for (kernels::GemmTile tile : kernels::alternatives(*h, tgt))
          if (auto l = kernels::plan(kernels::GemmKernel::wgmma, g, tgt, tile)) launches.push_back(*l);
        for (const kernels::GemmLaunch& l : launches) {
          CAPTURE(g.text());
          CAPTURE(l.text());
          CHECK(check_launch(l, static_cast<std::uint32_t>(runs)) <= tolerance(math));
          ++runs;
        }
      }
  MESSAGE(runs << " launches checked");
}
