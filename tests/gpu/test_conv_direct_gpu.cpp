// The direct conv kind (stride-1 forward and input gradient over few channels, on the CUDA
// cores) launched as planned, against the CPU convolution in f64 of the same rounded inputs:
// one input channel with and without padding, two channels with a rectangular window and
// unequal padding, a 7x7 input gradient to three channels, in bf16, f16 and f32.
// Each element may differ by tol * sum |a||b| of its own terms.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda/generated/conv/conv_plan.h"
#include "element_bytes.h"
#include "kiln/kiln.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/memory.h"

using namespace kiln;
using kernels::ConvKernel;
using kernels::ConvPass;

namespace {

struct DirectCase {
  std::string name;
  Shape x, w;
  std::int64_t ph, pw;
  bool forward, grad_input;  // which passes the kind plans
};

kernels::ConvGeometry geometry(const DirectCase& c) {
  const std::int64_t oh = c.x[2] + 2 * c.ph - c.w[2] + 1, ow = c.x[3] + 2 * c.pw - c.w[3] + 1;
  return {c.x[0], c.x[1], c.x[2], c.x[3], c.w[0], c.w[2], c.w[3], oh, ow, 1, 1, c.ph, c.pw, 1, 1, 1};
}

// Worst |gpu - ref| / (sum |a||b|) of one pass (0 forward, 1 input gradient) in `dt`.
double worst_error(const DirectCase& c, int pass, DType dt) {
  const kernels::ConvGeometry g = geometry(c);
  const Conv2dOptions o{.padding = {c.ph, c.pw}};
  const Shape in = pass == 0 ? c.x : Shape{g.n, g.o, g.oh, g.ow};
  const Shape out = pass == 0 ? Shape{g.n, g.o, g.oh, g.ow} : c.x;
  Generator gen(17 + pass);
  const Tensor a = randn(in, {.dtype = DType::f64}, &gen).to(dt), w = randn(c.w, {.dtype = DType::f64}, &gen).to(dt);
  const Tensor a64 = a.to(DType::f64), w64 = w.to(DType::f64);
  auto reference = [&](const Tensor& x, const Tensor& k) {
    return pass == 0 ? conv2d(x, k, {}, o) : conv2d_grad_input(x, k, c.x, o);
  };
  const std::vector<double> ref = reference(a64, w64).to_vector<double>();
  const std::vector<double> scale = reference(abs(a64), abs(w64)).to_vector<double>();

  const ConvPass p = pass == 0 ? ConvPass::forward : ConvPass::grad_input;
  const rt::DeviceInfo& info = rt::device_info(0);
  const kernels::ConvTarget target{info.sm_count, info.max_shared_optin};
  const auto math = kernels::conv_math(dt, dt, dt, false);
  REQUIRE(math);
  const auto l = kernels::plan(ConvKernel::direct, p, g, dt, *math, target);
  REQUIRE(l);
  const rt::Stream& s = rt::default_stream(0);
  auto upload = [&](const Tensor& t) {
    const std::size_t bytes = static_cast<std::size_t>(t.numel()) * dtype_size(dt);
    rt::DeviceBuffer buf(bytes, s);
    rt::copy_to_device(buf.ptr(), t.contiguous().data_ptr(), bytes, s);
    return buf;
  };
  const rt::DeviceBuffer da = upload(a), dw = upload(w), dy = upload(zeros(out, {.dtype = dt}));
  kernels::launch(*l, {da.ptr(), dw.ptr(), dy.ptr(), dt, &s});
  std::vector<unsigned char> host(static_cast<std::size_t>(shape_numel(out)) * dtype_size(dt));
  rt::copy_to_host(host.data(), dy.ptr(), host.size(), s);
  s.synchronize();
  std::vector<double> got(static_cast<std::size_t>(shape_numel(out)));
  for (std::size_t i = 0; i < got.size(); ++i) got[i] = kiln_test::get_element(dt, host.data(), static_cast<std::int64_t>(i));
  REQUIRE(got.size() == ref.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(got[i] - ref[i]) / (scale[i] + 1e-30);
    if (!(e <= 1e300)) return INFINITY;
    worst = std::max(worst, e);
  }
  return worst;
}

}  // namespace

TEST_CASE("direct convolutions over few channels match the f64 reference in bf16, f16 and f32") {
  const std::vector<DirectCase> cases = {
      {"mnist conv1 b4", {4, 1, 28, 28}, {32, 1, 5, 5}, 2, 2, true, true},
      {"speedrun conv1 b3", {3, 1, 28, 28}, {24, 1, 5, 5}, 0, 0, true, true},
      {"2 channels 3x4 p(1,2) 13x11", {3, 2, 13, 11}, {6, 2, 3, 4}, 1, 2, true, true},
      {"7x7 p3 40 -> 3 channels, odd width", {2, 3, 9, 13}, {40, 3, 7, 7}, 3, 3, false, true},
  };
  // bf16 and f16 outputs round to 8 and 11 bits; f32 sums exactly rounded products.
  const std::vector<std::pair<DType, double>> precisions{{DType::bf16, 8e-3}, {DType::f16, 1.5e-3}, {DType::f32, 1e-5}};
  const rt::DeviceInfo& info = rt::device_info(0);
  const kernels::ConvTarget target{info.sm_count, info.max_shared_optin};
  for (const DirectCase& c : cases) {
    const auto math = kernels::conv_math(DType::f32, DType::f32, DType::f32, false);
    CHECK(kernels::plan(ConvKernel::direct, ConvPass::forward, geometry(c), DType::f32, *math, target).has_value() ==
          c.forward);
    CHECK(kernels::plan(ConvKernel::direct, ConvPass::grad_input, geometry(c), DType::f32, *math, target).has_value() ==
          c.grad_input);
    for (const auto& [dt, tol] : precisions)
      for (int pass = 0; pass < 2; ++pass) {
        if (!(pass == 0 ? c.forward : c.grad_input)) continue;
        const std::string what = c.name + " " + std::string(dtype_name(dt)) + " pass " + std::to_string(pass);
        CAPTURE(what);
        CHECK(worst_error(c, pass, dt) <= tol);
      }
  }
}
