// The tile engine's NHWC copy of a convolution's images, and its flipped reorder of the weights,
// made by the forward, serve the weight and input gradients of the same operands, which then make
// none: the same bits as gradients that stage their operands themselves, and operands written or
// freed in between are staged again. So does the patch kind's forward, whose blocks write its input
// gradient's reordered weights, grouped or not, in bf16, f16 and TF32.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cuda/generated/conv/conv_plan.h"
#include "backend/cuda/generated/conv/conv_run.h"
#include "device_buffers.h"
#include "gpu_match.h"
#include "kiln/kiln.h"
#include "kiln/runtime/device.h"

using namespace kiln;
using kiln_test::bytes_of;
using kiln_test::half_bits;
using kiln_test::kGpu;
using kiln_test::upload;

namespace {

const Conv2dOptions kPad1{.padding = {1}};

}  // namespace

TEST_CASE("conv2d: the forward's NHWC copy of x serves its weight gradient, bit for bit") {
  const bool engine = rt::device_info(0).arch() >= 90;  // the tile engine's convolution modes
  for (DType t : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(t));
    Generator g(3);
    const Tensor x = randn({16, 32, 14, 14}, {}, &g).to(kGpu).to(t);
    const Tensor gy = randn({16, 64, 14, 14}, {}, &g).to(kGpu).to(t);
    const Tensor w = mul(randn({64, 32, 3, 3}, {}, &g), 0.1).to(t).to(kGpu).detach().requires_grad_();
    const std::vector<std::uint16_t> want = half_bits(conv2d_grad_weight(x, gy, w.shape(), kPad1));
    std::size_t kept = 0;
    {
      const Tensor y = conv2d(x, w, Tensor(), kPad1);
      kept = kernels::conv_images_kept();
      if (engine) CHECK(kept >= 1);
      y.backward(gy);
    }
    CHECK(half_bits(w.grad()) == want);
    if (engine) CHECK(kernels::conv_images_kept() == kept - 1);  // the weight gradient took it
    // Without gradients for w nothing is kept.
    {
      NoGradGuard no_grad;
      const std::size_t before = kernels::conv_images_kept();
      (void)conv2d(x, w, Tensor(), kPad1);
      CHECK(kernels::conv_images_kept() == before);
    }
  }
}

TEST_CASE("conv2d: images written, or freed and their memory reused, after the forward are copied again") {
  Generator g(4);
  const Tensor gy = randn({16, 64, 14, 14}, {}, &g).to(kGpu).to(DType::bf16);
  const Tensor w = mul(randn({64, 32, 3, 3}, {}, &g), 0.1).to(DType::bf16).to(kGpu).detach().requires_grad_();
  const Tensor values = randn({16, 32, 14, 14}, {}, &g).to(DType::bf16);
  const Tensor doubled = mul(values, 2.0);
  const std::vector<std::uint16_t> want_doubled = half_bits(conv2d_grad_weight(doubled.to(kGpu), gy, w.shape(), kPad1));
  {  // written in place: the kept copy is of the old values
    Tensor x = values.to(kGpu);
    (void)conv2d(x, w, Tensor(), kPad1);
    {
      NoGradGuard no_grad;
      x.mul_(2.0);
    }
    CHECK(half_bits(conv2d_grad_weight(x, gy, w.shape(), kPad1)) == want_doubled);
  }
  {  // freed: a new tensor in its memory (the pool's first fit) holds other values
    Tensor x = values.to(kGpu);
    const void* at = x.data_ptr();
    (void)conv2d(x, w, Tensor(), kPad1);
    x = Tensor();
    const Tensor other = doubled.to(kGpu);
    CAPTURE(other.data_ptr() == at);
    CHECK(half_bits(conv2d_grad_weight(other, gy, w.shape(), kPad1)) == want_doubled);
  }
}

TEST_CASE("conv2d: the forward's flipped reorder of w serves the input gradient, bit for bit") {
  const bool engine = rt::device_info(0).arch() >= 90;
  for (DType t : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(t));
    Generator g(6);
    const Tensor x = randn({16, 32, 14, 14}, {}, &g).to(t).to(kGpu).detach().requires_grad_();
    const Tensor gy = randn({16, 64, 14, 14}, {}, &g).to(kGpu).to(t);
    const Tensor w = mul(randn({64, 32, 3, 3}, {}, &g), 0.1).to(t).to(kGpu);
    const std::vector<std::uint16_t> want = half_bits(conv2d_grad_input(gy, w, x.shape(), kPad1));
    std::size_t kept = 0;
    {
      const Tensor y = conv2d(x, w, Tensor(), kPad1);
      kept = kernels::conv_weights_kept();
      if (engine) CHECK(kept >= 1);
      y.backward(gy);
    }
    CHECK(half_bits(x.grad()) == want);
    if (engine) CHECK(kernels::conv_weights_kept() == kept - 1);  // the input gradient took it
  }
}

TEST_CASE("conv2d: weights written after the forward are reordered again for the input gradient") {
  Generator g(7);
  const Tensor gy = randn({16, 64, 14, 14}, {}, &g).to(kGpu).to(DType::bf16);
  const Tensor x = randn({16, 32, 14, 14}, {}, &g).to(DType::bf16).to(kGpu).detach().requires_grad_();
  const Tensor values = mul(randn({64, 32, 3, 3}, {}, &g), 0.1).to(DType::bf16);
  const std::vector<std::uint16_t> want = half_bits(conv2d_grad_input(gy, mul(values, 2.0).to(kGpu), x.shape(), kPad1));
  Tensor w = values.to(kGpu);
  (void)conv2d(x, w, Tensor(), kPad1);
  w.mul_(2.0);
  CHECK(half_bits(conv2d_grad_input(gy, w, x.shape(), kPad1)) == want);
}

TEST_CASE("conv2d: the patch kind's forward also writes its input gradient's weights, bit for bit") {
  const rt::DeviceInfo& info = rt::device_info(0);
  const kernels::ConvTarget target{info.sm_count, info.max_shared_optin};
  const rt::Stream& s = rt::default_stream(0);
  // The speedrun's conv2 (24 -> 32, 3x3, no padding), and a grouped one (two groups of 16, padded).
  const kernels::ConvGeometry geometries[] = {{8, 24, 12, 12, 32, 3, 3, 10, 10, 1, 1, 0, 0, 1, 1, 1},
                                              {4, 32, 10, 10, 32, 3, 3, 10, 10, 1, 1, 1, 1, 1, 1, 2}};
  for (const kernels::ConvGeometry& g : geometries)
    for (DType t : {DType::bf16, DType::f16, DType::f32}) {
      CAPTURE(g.text());
      CAPTURE(dtype_name(t));
      const auto math = kernels::conv_math(t, t, t, true);
      REQUIRE(math);
      const auto fwd = kernels::plan(kernels::ConvKernel::patch, kernels::ConvPass::forward, g, t, *math, target);
      const auto dgrad = kernels::plan(kernels::ConvKernel::patch, kernels::ConvPass::grad_input, g, t, *math, target);
      REQUIRE(fwd);
      REQUIRE(dgrad);
      CHECK(std::get<kernels::PatchPlan>(fwd->plan).flipped_run ==
            std::get<kernels::PatchPlan>(dgrad->plan).channel_run);
      Generator gen(8);
      const Tensor x = randn({g.n, g.c, g.h, g.w}, {}, &gen).to(t);
      const Tensor w = mul(randn({g.o, g.c / g.groups, g.kh, g.kw}, {}, &gen), 0.1).to(t);
      const Tensor gy = randn({g.n, g.o, g.oh, g.ow}, {}, &gen).to(t);
      const rt::DeviceBuffer dx_in = upload(x, s), dw = upload(w, s), dgy = upload(gy, s);
      const rt::DeviceBuffer y(static_cast<std::size_t>(gy.numel()) * dtype_size(t), s);
      const rt::DeviceBuffer want(dx_in.bytes(), s), got(dx_in.bytes(), s), stale(dx_in.bytes(), s);
      kernels::launch(*dgrad, {dgy.ptr(), dw.ptr(), want.ptr(), t, &s});  // stages w itself
      const auto owner = std::make_shared<int>(0);
      {
        const kernels::ConvForBackward keep(kernels::ConvStaged::weights, dw.ptr(), owner, 1);
        kernels::launch(*fwd, {dx_in.ptr(), dw.ptr(), y.ptr(), t, &s});
      }
      // Keeping frees the copies of operands freed since (earlier cases'), so count from here.
      const std::size_t kept = kernels::conv_weights_kept();
      CHECK(kept >= 1);
      {  // w written since (another version): the copy is not taken
        const kernels::ConvForBackward take(kernels::ConvStaged::weights, dw.ptr(), owner, 2);
        kernels::launch(*dgrad, {dgy.ptr(), dw.ptr(), stale.ptr(), t, &s});
      }
      CHECK(kernels::conv_weights_kept() == kept);
      {
        const kernels::ConvForBackward take(kernels::ConvStaged::weights, dw.ptr(), owner, 1);
        kernels::launch(*dgrad, {dgy.ptr(), dw.ptr(), got.ptr(), t, &s});
      }
      CHECK(kernels::conv_weights_kept() == kept - 1);  // the input gradient took it
      const std::vector<unsigned char> expected = bytes_of(want, s);
      CHECK(bytes_of(got, s) == expected);
      CHECK(bytes_of(stale, s) == expected);
    }
}
