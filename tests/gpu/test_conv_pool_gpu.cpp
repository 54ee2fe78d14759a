// matmul, linear, conv2d, max_pool2d and avg_pool2d on cuda:0 against the CPU reference:
// forward outputs and input gradients for the same inputs and cotangent, per dtype, with
// the first mismatches printed. Includes transposed/strided views, broadcast batches,
// grouped/strided/dilated convs and a conv large enough to be processed in chunks.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/registry.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

double conv_tolerance(DType t) {
  switch (t) {
    case DType::f64:
      return 1e-9;
    case DType::f32:
      return 2e-4;
    case DType::f16:
      return 3e-2;
    default:
      return 1e-1;
  }
}

// Output followed by the gradient of every input, on `device`, as f64 host vectors.
std::vector<std::vector<double>> run(const Fn& f, const std::vector<Tensor>& inputs, Device device, bool view_first,
                                     std::uint64_t seed) {
  std::vector<Tensor> leaves;
  for (const Tensor& t : inputs) {
    Tensor l = t.detach().to(device);  // a fresh leaf on either device
    l.requires_grad_();
    leaves.push_back(l);
  }
  std::vector<Tensor> args = leaves;
  if (view_first) {
    // The first input as a non-contiguous view: its last two dims swapped twice over a transposed copy.
    Tensor t = args[0];
    Shape sh = t.shape(), st = t.strides();
    std::swap(sh[sh.size() - 1], sh[sh.size() - 2]);
    std::swap(st[st.size() - 1], st[st.size() - 2]);
    Tensor tt = make_view(t, sh, st, t.offset()).contiguous();
    Shape sh2 = tt.shape(), st2 = tt.strides();
    std::swap(sh2[sh2.size() - 1], sh2[sh2.size() - 2]);
    std::swap(st2[st2.size() - 1], st2[st2.size() - 2]);
    args[0] = make_view(tt, sh2, st2, tt.offset()).detach().requires_grad_();
    leaves[0] = args[0];
  }
  Tensor y = f(args);
  Generator gen(seed);
  Tensor cot = randn(y.shape(), {.dtype = DType::f64}, &gen).to(y.dtype()).to(device);
  y.backward(cot);
  std::vector<std::vector<double>> r{y.to(DType::f64).to_vector<double>()};
  for (const Tensor& l : leaves) r.push_back(l.grad().to(DType::f64).to_vector<double>());
  return r;
}

void compare(const std::string& name, const Fn& f, const std::vector<Shape>& shapes, DType dt,
             bool view_first = false) {
  std::vector<Tensor> inputs;
  Generator gen(17);
  for (const Shape& s : shapes) inputs.push_back(randn(s, {.dtype = DType::f64}, &gen).to(dt));
  auto cpu = run(f, inputs, Device::cpu(), view_first, 5);
  auto gpu = run(f, inputs, Device::cuda(0), view_first, 5);
  const double tol = conv_tolerance(dt);
  for (std::size_t k = 0; k < cpu.size(); ++k) {
    const std::string what = name + "(dtype=" + std::string(dtype_name(dt)) + ")" +
                             (k == 0 ? " output" : " grad of input " + std::to_string(k - 1));
    REQUIRE_MESSAGE(cpu[k].size() == gpu[k].size(), what);
    std::ostringstream msg;
    int bad = 0;
    for (std::size_t i = 0; i < cpu[k].size(); ++i) {
      const double a = cpu[k][i], b = gpu[k][i];
      const bool ok = (std::isnan(a) && std::isnan(b)) || std::fabs(a - b) <= tol * (1 + std::fabs(a));
      if (!ok && bad++ < 5) msg << "\n  [" << i << "] cpu " << a << " gpu " << b;
    }
    CHECK_MESSAGE(bad == 0, what << ": " << bad << " mismatches" << msg.str());
  }
}

const DType kConvDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

}  // namespace

TEST_CASE("matmul and linear on the GPU match the CPU, forward and backward") {
  Fn mm = [](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); };
  for (DType dt : kConvDTypes) {
    compare("matmul[64,48]@[48,32]", mm, {{64, 48}, {48, 32}}, dt);
    compare("matmul[3,1,17,9]@[4,9,5]", mm, {{3, 1, 17, 9}, {4, 9, 5}}, dt);
    compare("matmul[2,3,9,7]^T-view@[7,5]", mm, {{2, 3, 9, 7}, {7, 5}}, dt, true);
    compare("matmul[9]@[3,9,5]", mm, {{9}, {3, 9, 5}}, dt);
    compare("matmul[4,6,9]@[9]", mm, {{4, 6, 9}, {9}}, dt);
    compare("matmul[33]@[33]", mm, {{33}, {33}}, dt);
    compare(
        "linear[5,7,12]x[10,12]+[10]", [](const std::vector<Tensor>& x) { return linear(x[0], x[1], x[2]); },
        {{5, 7, 12}, {10, 12}, {10}}, dt);
  }
  // An operand with no unit stride is copied before cuBLAS sees it; results agree.
  Generator g0(9);
  Tensor base = randn({4, 12}, {}, &g0), rhs = randn({6, 3}, {}, &g0);
  auto strided = [](const Tensor& t) { return make_view(t, {4, 6}, {12, 2}, t.offset()); };
  auto want_s = matmul(strided(base), rhs).to_vector<float>();
  auto got_s = matmul(strided(base.to(Device::cuda(0))), rhs.to(Device::cuda(0))).to_vector<float>();
  for (std::size_t i = 0; i < want_s.size(); ++i) CHECK(got_s[i] == doctest::Approx(want_s[i]).epsilon(1e-4));

  set_allow_tf32(true);
  Generator gen(3);
  Tensor a = randn({256, 256}, {}, &gen), b = randn({256, 256}, {}, &gen);
  auto want = matmul(a, b).to_vector<float>();
  auto got = matmul(a.to(Device::cuda(0)), b.to(Device::cuda(0))).to_vector<float>();
  set_allow_tf32(false);
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(double(want[i]) - got[i]));
  CHECK(worst < 0.1);  // TF32 keeps 10 mantissa bits: |error| ~ 16 * 2^-11 * sqrt(256)
}

TEST_CASE("conv2d on the GPU matches the CPU, forward and backward") {
  struct Case {
    std::string name;
    Shape x, w;
    Conv2dOptions o;
  };
  const std::vector<Case> cases = {
      {"conv2d[2,3,9,8]*[4,3,3,3]", {2, 3, 9, 8}, {4, 3, 3, 3}, {}},
      {"conv2d[2,4,11,10]*[6,2,3,2],s2,p1,g2", {2, 4, 11, 10}, {6, 2, 3, 2}, {{2}, {1}, {1}, 2}},
      {"conv2d[3,6,8,9]*[6,1,3,3],depthwise,p1,d2", {3, 6, 8, 9}, {6, 1, 3, 3}, {{1}, {1, 2}, {2}, 6}},
      {"conv2d[1,5,7,7]*[3,5,1,1],s3", {1, 5, 7, 7}, {3, 5, 1, 1}, {{3}, {0}, {1}, 1}},
  };
  // The im2col + cuBLAS path, exact in f32 (test_conv_igemm_gpu.cpp covers the tensor cores).
  const bool tf32 = allow_conv_tf32();
  set_allow_conv_tf32(false);
  for (DType dt : kConvDTypes)
    for (const auto& c : cases) {
      Fn f = [o = c.o](const std::vector<Tensor>& x) { return conv2d(x[0], x[1], x[2], o); };
      compare(c.name, f, {c.x, c.w, {c.w[0]}}, dt);
    }
  // A non-contiguous input (H and W swapped twice) goes through a copy on the GPU.
  compare(
      "conv2d[2,3,8,8]-view", [](const std::vector<Tensor>& x) { return conv2d(x[0], x[1]); },
      {{2, 3, 8, 8}, {2, 3, 3, 3}}, DType::f32, true);
  // cols of 300 samples exceed the workspace: several chunks, the weight gradient accumulating.
  compare(
      "conv2d[300,8,64,64]*[4,8,3,3],p1",
      [](const std::vector<Tensor>& x) { return conv2d(x[0], x[1], {}, {.padding = {1}}); },
      {{300, 8, 64, 64}, {4, 8, 3, 3}}, DType::f32);
  set_allow_conv_tf32(tf32);
}

TEST_CASE("max_pool2d and avg_pool2d on the GPU match the CPU, forward and backward") {
  using V = std::vector<std::int64_t>;
  for (DType dt : kConvDTypes) {
    compare(
        "max_pool2d[2,3,8,8],k2", [](const std::vector<Tensor>& x) { return max_pool2d(x[0], {2}); }, {{2, 3, 8, 8}},
        dt);
    // Tiling windows whose last row and column stop short of the input's (zeros there).
    compare(
        "max_pool2d[2,3,9,7],k(2,3)", [](const std::vector<Tensor>& x) { return max_pool2d(x[0], V{2, 3}); },
        {{2, 3, 9, 7}}, dt);
    compare(
        "max_pool2d[2,3,9,7],k3,s2,p1,d(1,2)",
        [](const std::vector<Tensor>& x) {
          return max_pool2d(x[0], {3}, {2}, {1}, V{1, 2});
        },
        {{2, 3, 9, 7}}, dt);
    compare(
        "avg_pool2d[2,3,8,8],k2", [](const std::vector<Tensor>& x) { return avg_pool2d(x[0], {2}); }, {{2, 3, 8, 8}},
        dt);
    compare(
        "avg_pool2d[2,3,9,7],k3,s2,p1", [](const std::vector<Tensor>& x) { return avg_pool2d(x[0], {3}, {2}, {1}); },
        {{2, 3, 9, 7}}, dt);
    compare(
        "avg_pool2d[2,3,9,7],k(3,2),s1,p(1,1),exclude_pad",
        [](const std::vector<Tensor>& x) {
          return avg_pool2d(x[0], V{3, 2}, {1}, V{1, 1}, false);
        },
        {{2, 3, 9, 7}}, dt);
  }
  compare(
      "max_pool2d[2,3,8,8]-view,k3,s2", [](const std::vector<Tensor>& x) { return max_pool2d(x[0], {3}, {2}); },
      {{2, 3, 8, 8}}, DType::f32, true);
}
