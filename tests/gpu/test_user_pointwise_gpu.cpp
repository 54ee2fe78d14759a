// User pointwise ops (kiln/pointwise.h) on the GPU against the CPU evaluator: every floating
// dtype, contiguous, transposed and broadcast operands, params per call, and gradients
// (including a gradient split into steps) computed on the GPU.
#include <doctest/doctest.h>

#include <string>
#include <tuple>
#include <vector>

#include "gpu_match.h"
#include "gradcheck.h"
#include "user_ops.h"
#include "kiln/kiln.h"

using namespace kiln;
using kiln_test::check_match;
using kiln_test::mix;
using kiln_test::ratio;
using kiln_test::swish;

namespace {

using kiln_test::kGpu;

// One rounding of the result in the dtype apart, plus expf/exp differences in float.
double user_op_tolerance(DType t) { return t == DType::f64 ? 1e-12 : t == DType::f32 ? 1e-5 : t == DType::f16 ? 2e-3 : 1e-2; }

std::string case_name(const char* op, DType t, const char* layout) {
  return std::string(op) + "(dtype=" + std::string(dtype_name(t)) + ", " + layout + ")";
}

}  // namespace

TEST_CASE("user pointwise ops: GPU matches CPU in every floating dtype and layout") {
  Generator gen(11);
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    const double tol = user_op_tolerance(t);
    // (37, 53): odd sizes reach the vector kernels' scalar tails.
    Tensor x = randn({37, 53}, {.dtype = t}, &gen);
    check_match(swish(x, 1.25), swish(x.to(kGpu), 1.25), tol, case_name("swish", t, "contiguous"));
    check_match(swish(x, -0.5), swish(x.to(kGpu), -0.5), tol, case_name("swish", t, "beta=-0.5"));
    Tensor xt = transpose(x, 0, 1);
    check_match(swish(xt, 2.0), swish(transpose(x.to(kGpu), 0, 1), 2.0), tol, case_name("swish", t, "transposed"));

    Tensor a = randn({37, 1}, {.dtype = t}, &gen);
    Tensor b = randn({1, 53}, {.dtype = t}, &gen);
    check_match(mix(a, b, 0.3, -0.6), mix(a.to(kGpu), b.to(kGpu), 0.3, -0.6), tol, case_name("mix", t, "broadcast"));
    Tensor y = randn({37, 53}, {.dtype = t}, &gen);
    check_match(mix(x, y, 0.5, 0.1), mix(x.to(kGpu), y.to(kGpu), 0.5, 0.1), tol, case_name("mix", t, "contiguous"));
    check_match(mix(xt, b.reshape({53, 1}), 0.5, 0.1),
                mix(transpose(x.to(kGpu), 0, 1), b.to(kGpu).reshape({53, 1}), 0.5, 0.1), tol,
                case_name("mix", t, "transposed_broadcast"));
    Tensor d = add(rand({1, 53}, {.dtype = t}, &gen), 0.5);  // away from 0
    check_match(ratio(x, d), ratio(x.to(kGpu), d.to(kGpu)), tol, case_name("ratio", t, "broadcast"));
  }
}

TEST_CASE("user pointwise ops: gradients on the GPU match the CPU") {
  Generator gen(5);
  for (DType t : {DType::f32, DType::f64}) {
    const double tol = user_op_tolerance(t) * 10;
    Tensor a = randn({7, 1}, {.dtype = t}, &gen);
    Tensor b = add(rand({1, 9}, {.dtype = t}, &gen), 0.5);
    Tensor cot = randn({7, 9}, {.dtype = t}, &gen);
    // f(a, b) summed against a fixed cotangent, on one device; returns (grad a, grad b).
    auto grads = [&](Device dev, auto&& f) {
      Tensor ad = a.to(dev).detach().requires_grad_(), bd = b.to(dev).detach().requires_grad_();
      sum(mul(f(ad, bd), cot.to(dev))).backward();
      return std::pair{ad.grad(), bd.grad()};
    };
    auto swish_ab = [](const Tensor& p, const Tensor& q) { return mul(swish(p, 0.7), q); };
    auto mix_ab = [](const Tensor& p, const Tensor& q) { return mix(p, q, 0.25, 0.5); };
    auto ratio_ab = [](const Tensor& p, const Tensor& q) { return ratio(p, q); };
    for (auto& [name, cpu, gpu] :
         std::vector<std::tuple<const char*, std::pair<Tensor, Tensor>, std::pair<Tensor, Tensor>>>{
             {"swish", grads(Device::cpu(), swish_ab), grads(kGpu, swish_ab)},
             {"mix", grads(Device::cpu(), mix_ab), grads(kGpu, mix_ab)},
             {"ratio", grads(Device::cpu(), ratio_ab), grads(kGpu, ratio_ab)}}) {
      check_match(cpu.first, gpu.first, tol, case_name(name, t, "grad a"));
      check_match(cpu.second, gpu.second, tol, case_name(name, t, "grad b"));
    }
  }
  // And against finite differences, through the GPU kernels of the gradient expressions.
  Tensor a = from_vector(std::vector<double>{0.5, -1, 2}, {3, 1}, {.dtype = DType::f64}).to(kGpu);
  Tensor b = from_vector(std::vector<double>{1, 1.5, -2, 3}, {1, 4}, {.dtype = DType::f64}).to(kGpu);
  auto r = kiln::testing::gradcheck([](const auto& in) { return ratio(in[0], in[1]); }, {a, b});
  CHECK_MESSAGE(r.ok, r.message);
  auto r2 = kiln::testing::gradcheck([](const auto& in) { return mix(in[0], in[1], 0.3, -0.7); }, {a, b});
  CHECK_MESSAGE(r2.ok, r2.message);
}
