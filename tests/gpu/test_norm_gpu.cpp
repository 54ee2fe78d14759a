// batch_norm and layer_norm kernels (kernel_templates/norm.cu) against the CPU reference:
// forward and gradients in f32/f64/f16/bf16 with and without weight/bias and the fused ReLU,
// 2-D and 4-D inputs with odd sizes and enough values per channel for several blocks,
// running statistics over several steps, eval mode, bf16/f16 x with f32 parameters, NaN
// propagation, bit-identical results across runs and replays of a compiled step (and the
// kernels one step launches), and errors for bad input.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "error_message.h"
#include "gpu_match.h"
#include "kiln/kiln.h"

using namespace kiln;
using kiln_test::check_match;

namespace {

using kiln_test::kGpu;

double norm_tolerance(DType t) {
  switch (t) {
    case DType::f16:
      return 1e-2;
    case DType::bf16:
      return 4e-2;
    case DType::f64:
      return 1e-11;
    default:
      return 5e-5;
  }
}

Tensor norm_normal(const Shape& s, std::uint64_t seed, double scale = 1.0, double shift = 0.0) {
  Generator g(seed);
  return add(mul(randn(s, {.dtype = DType::f64}, &g), scale), shift);
}

using kiln_test::f32_bits;

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// f on each device from the same values (x in dtype t, parameters in p), then backward with
// one cotangent: outputs and every input's gradient must match.
void check_norm_both(const Fn& f, const std::vector<Tensor>& inputs, DType t, DType p, const std::string& name) {
  std::vector<Tensor> cpu_in, gpu_in;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    // detach: .to() returns the same tensor when the dtype matches, and its grad would pile up.
    const Tensor c = inputs[i].to(i == 0 ? t : p).detach().requires_grad_();
    cpu_in.push_back(c);
    gpu_in.push_back(c.detach().to(kGpu).requires_grad_());
  }
  const Tensor yc = f(cpu_in), yg = f(gpu_in);
  check_match(yc, yg, norm_tolerance(t), name + " forward");
  const Tensor cot = norm_normal(yc.shape(), 3).to(yc.dtype());
  yc.backward(cot);
  yg.backward(cot.to(kGpu));
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    REQUIRE(cpu_in[i].grad().defined());
    CHECK(gpu_in[i].grad().dtype() == cpu_in[i].dtype());
    // Gradients sum over a channel or a row: a few times the forward's rounding.
    check_match(cpu_in[i].grad(), gpu_in[i].grad(), 4 * norm_tolerance(i == 0 ? t : p), name + " grad " + std::to_string(i));
  }
}

const DType kNormDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

}  // namespace

TEST_CASE("batch_norm on the GPU matches the CPU: forward and gradients, every dtype, relu, optional affine") {
  for (DType t : kNormDTypes)
    for (const Shape& s : {Shape{2, 3, 5, 7}, Shape{4, 3}, Shape{1, 3, 5, 7}, Shape{16, 4, 30, 31}, Shape{300, 5}}) {
      const std::string name = std::string(dtype_name(t)) + " " + shape_str(s);
      const std::int64_t c = s[1];
      const Tensor x = norm_normal(s, 1, 2.0, 0.5), w = norm_normal({c}, 2), b = norm_normal({c}, 3);
      const Tensor rm = norm_normal({c}, 4), rv = norm_normal({c}, 5, 0.2, 1.0);
      for (Activation act : {Activation::none, Activation::relu}) {
        const std::string n = name + (act == Activation::relu ? " relu" : "");
        check_norm_both([&](const auto& v) { return batch_norm(v[0], {}, {}, v[1], v[2], true, 0.1, 1e-5, act); }, {x, w, b},
                   t, t, "train " + n);
        check_norm_both([&](const auto& v) { return batch_norm(v[0], {}, {}, {}, {}, true, 0.1, 1e-5, act); }, {x}, t, t,
                   "train no affine " + n);
        check_norm_both(
            [&](const auto& v) {
              return batch_norm(v[0], rm.to(t).to(v[0].device()), rv.to(t).to(v[0].device()), v[1], {}, false, 0.1,
                                1e-5, act);
            },
            {x, w}, t, t, "eval weight only " + n);
      }
    }
}

TEST_CASE("layer_norm on the GPU matches the CPU: forward and gradients, warp and block rows") {
  for (DType t : kNormDTypes)
    for (const auto& sr : {std::pair<Shape, Shape>{{4, 6, 5}, {5}},
                           {{3, 2, 4}, {2, 4}},
                           {{1, 7}, {7}},
                           {{3, 1100}, {1100}},
                           {{2, 3, 40, 41}, {40, 41}},
                           {{700, 33}, {33}}}) {
      const Shape& s = sr.first;  // not a structured binding: clang 14 lambdas cannot capture one
      const Shape& row = sr.second;
      const std::string name = std::string(dtype_name(t)) + " " + shape_str(s);
      const Tensor x = norm_normal(s, 6, 2.0, 1.0), w = norm_normal(row, 7), b = norm_normal(row, 8);
      check_norm_both([&](const auto& v) { return layer_norm(v[0], row, v[1], v[2]); }, {x, w, b}, t, t, name);
      check_norm_both([&](const auto& v) { return layer_norm(v[0], row); }, {x}, t, t, "no affine " + name);
      check_norm_both([&](const auto& v) { return layer_norm(v[0], row, v[1]); }, {x, w}, t, t, "weight only " + name);
    }
}

TEST_CASE("mixed precision on the GPU: bf16/f16 x with f32 parameters and running statistics") {
  for (DType t : {DType::bf16, DType::f16}) {
    const std::string name(dtype_name(t));
    const Tensor x = norm_normal({8, 3, 6, 5}, 10, 1.5, -0.5), w = norm_normal({3}, 11), b = norm_normal({3}, 12);
    check_norm_both([](const auto& v) { return batch_norm(v[0], {}, {}, v[1], v[2], true, 0.1, 1e-5, Activation::relu); },
               {x, w, b}, t, DType::f32, "batch_norm " + name);
    const Tensor lw = norm_normal({5}, 13), lb = norm_normal({5}, 14);
    check_norm_both([](const auto& v) { return layer_norm(v[0], {5}, v[1], v[2]); }, {x, lw, lb}, t, DType::f32,
               "layer_norm " + name);
    // The f32 running statistics are updated in place on each device; eval reads them.
    Tensor rm = zeros({3}), rv = ones({3});
    Tensor rmg = rm.to(kGpu), rvg = rv.to(kGpu);
    const void* where = rmg.data_ptr();
    for (int step = 0; step < 4; ++step) {
      const Tensor xs = norm_normal({8, 3, 6, 5}, 20 + static_cast<std::uint64_t>(step), 1.5, step).to(t);
      batch_norm(xs, rm, rv, w.to(DType::f32), b.to(DType::f32), true, 0.3);
      batch_norm(xs.to(kGpu), rmg, rvg, w.to(DType::f32).to(kGpu), b.to(DType::f32).to(kGpu), true, 0.3);
    }
    CHECK(rmg.dtype() == DType::f32);
    CHECK(rmg.data_ptr() == where);
    check_match(rm, rmg, 1e-5, "running_mean " + name);
    check_match(rv, rvg, 1e-5, "running_var " + name);
    check_match(batch_norm(x.to(t), rm, rv, w.to(DType::f32), {}, false),
                batch_norm(x.to(t).to(kGpu), rmg, rvg, w.to(DType::f32).to(kGpu), {}, false), norm_tolerance(t),
                "eval " + name);
  }
}

TEST_CASE("running statistics on the GPU follow the CPU over several steps, in every dtype") {
  for (DType t : kNormDTypes) {
    const std::string name(dtype_name(t));
    Tensor rm = norm_normal({5}, 30).to(t), rv = norm_normal({5}, 31, 0.1, 1.0).to(t);
    Tensor rmg = rm.to(kGpu), rvg = rv.to(kGpu);
    for (int step = 0; step < 5; ++step) {
      const Tensor xs = norm_normal({6, 5, 9, 11}, 40 + static_cast<std::uint64_t>(step), 1.0 + step, step).to(t);
      const Tensor y = batch_norm(xs, rm, rv, {}, {}, true, 0.2);
      const Tensor yg = batch_norm(xs.to(kGpu), rmg, rvg, {}, {}, true, 0.2);
      check_match(y, yg, norm_tolerance(t), name + " step " + std::to_string(step));
    }
    check_match(rm, rmg, norm_tolerance(t), "running_mean " + name);
    check_match(rv, rvg, norm_tolerance(t), "running_var " + name);
    // A non-contiguous running statistic is updated through a copy.
    Tensor base = zeros({10}, {.dtype = t, .device = kGpu});
    Tensor strided = slice(base, 0, 0, 10, 2);
    batch_norm(norm_normal({6, 5}, 50).to(t).to(kGpu), strided, rvg, {}, {}, true, 1.0);
    check_match(mean(norm_normal({6, 5}, 50).to(t), {0}), strided, norm_tolerance(t), "strided running_mean " + name);
  }
}

TEST_CASE("f32 statistics stay accurate far from zero (mean 1e4, std 1), with several blocks per channel") {
  // Welford in f32 on the raw values loses about 1e-4 of the variance here; on x - shift it
  // keeps about 1e-7.
  const Tensor x = norm_normal({64, 2, 20, 20}, 90, 1.0, 1e4).to(DType::f32);
  const Tensor x64 = x.to(DType::f64);
  Tensor rm = zeros({2}, {.device = kGpu}), rv = ones({2}, {.device = kGpu});
  const Tensor y = batch_norm(x.to(kGpu), rm, rv, {}, {}, true, 1.0);
  const Tensor want_var =
      mean(mul(sub(x64, mean(x64, {0, 2, 3}, true)), sub(x64, mean(x64, {0, 2, 3}, true))), {0, 2, 3});
  const std::vector<double> got = rv.to(Device::cpu()).to_vector<double>(), want = want_var.to_vector<double>();
  for (int c = 0; c < 2; ++c) CHECK(std::abs(got[c] * 25599 / 25600 - want[c]) < 2e-6 * want[c]);
  check_match(batch_norm(x64, Tensor(), Tensor(), {}, {}, true).to(DType::f32), y, 2e-3, "batch_norm y");
  const Tensor rows = reshape(x, {128, 400});
  check_match(layer_norm(rows.to(DType::f64), {400}).to(DType::f32), layer_norm(rows.to(kGpu), {400}), 2e-3,
              "layer_norm y");
}

TEST_CASE("NaN propagates to its channel or row only, on the GPU as on the CPU") {
  for (DType t : {DType::f32, DType::bf16}) {
    std::vector<double> v = norm_normal({4, 2, 3}, 60).to_vector<double>();
    v[1] = std::nan("");                                               // channel 0, row 0
    v[(1 * 2 + 1) * 3 + 2] = std::numeric_limits<double>::infinity();  // channel 1, row 3
    const Tensor x = from_vector(v, {4, 2, 3}, {.dtype = DType::f64}).to(t);
    Tensor rm = zeros({2}, {.device = kGpu}), rv = ones({2}, {.device = kGpu});
    const Tensor yg = batch_norm(x.to(kGpu), rm, rv, {}, {}, true);
    check_match(batch_norm(x, Tensor(), Tensor(), {}, {}, true), yg, norm_tolerance(t), "batch_norm");
    const std::vector<double> s = rm.to_vector<double>();
    CHECK(std::isnan(s[0]));
    CHECK(std::isnan(s[1]));
    // Channel 0 only: finite values elsewhere.
    std::vector<double> w = v;
    w[(1 * 2 + 1) * 3 + 2] = 0.5;
    const Tensor x1 = from_vector(w, {4, 2, 3}, {.dtype = DType::f64}).to(t);
    Tensor rm1 = zeros({2}, {.device = kGpu}), rv1 = ones({2}, {.device = kGpu});
    const std::vector<double> y1 =
        batch_norm(x1.to(kGpu), rm1, rv1, {}, {}, true).to(Device::cpu()).to_vector<double>();
    CHECK(std::isnan(rm1.to_vector<double>()[0]));
    CHECK(std::isfinite(rm1.to_vector<double>()[1]));
    for (int n = 0; n < 4; ++n) {
      CHECK(std::isnan(y1[(n * 2 + 0) * 3]));
      CHECK(std::isfinite(y1[(n * 2 + 1) * 3]));
    }
    const Tensor lg = layer_norm(x.to(kGpu), {3});
    check_match(layer_norm(x, {3}), lg, norm_tolerance(t), "layer_norm");
    const std::vector<double> l = lg.to(Device::cpu()).to_vector<double>();
    CHECK(std::isnan(l[0]));
    CHECK(std::isfinite(l[3]));
  }
}

TEST_CASE("batch_norm and layer_norm on the GPU are bit-identical across runs, and across compiled replays") {
  const Tensor x = norm_normal({32, 16, 12, 12}, 70, 3.0, 1.0).to(DType::f32).to(kGpu);
  const Tensor cot = norm_normal({32, 16, 12, 12}, 71).to(DType::f32).to(kGpu);
  Tensor w = norm_normal({16}, 72).to(DType::f32).to(kGpu).requires_grad_();
  Tensor b = norm_normal({16}, 73).to(DType::f32).to(kGpu).requires_grad_();
  Tensor lw = norm_normal({12}, 74).to(DType::f32).to(kGpu).requires_grad_();
  Tensor rm = zeros({16}, {.device = kGpu}), rv = ones({16}, {.device = kGpu});
  // One step: batch norm with the fused ReLU, then layer norm over the last dim, forward and backward.
  auto step = [&](const std::vector<Tensor>& in) {
    w.zero_grad();
    b.zero_grad();
    lw.zero_grad();
    const Tensor y = layer_norm(batch_norm(in[0], rm, rv, w, b, true, 0.1, 1e-5, Activation::relu), {12}, lw);
    sum(mul(y, in[1])).backward();
    return std::vector<Tensor>{y, w.grad(), b.grad(), lw.grad()};
  };
  auto snapshot = [](const std::vector<Tensor>& out) {
    std::vector<std::vector<std::uint32_t>> r;
    for (const Tensor& t : out) r.push_back(f32_bits(t));
    return r;
  };
  const auto eager = snapshot(step({x, cot}));
  CHECK(snapshot(step({x, cot})) == eager);  // run to run
  const auto rm_eager = f32_bits(rm);

  // The same step compiled: the eager call, the capture, then replays; the running statistics
  // advance at every call (one update per step), as eagerly.
  rm.fill_(0);
  rv.fill_(1);
  CompiledFunction cf = compile(step);
  for (int call = 0; call < 5; ++call) {
    CHECK(snapshot(cf({x, cot})) == eager);
    if (call == 1) CHECK(f32_bits(rm) == rm_eager);  // two updates, as the two eager steps above
  }
  const CompileStats st = cf.stats();
  CHECK(st.replays == 3);
  REQUIRE(st.kernel_names_per_graph.size() == 1);
  // Kernels per batch norm: two forward, two backward; per layer norm: one forward, two backward.
  const std::map<std::string, std::size_t>& k = st.kernel_names_per_graph[0];
  for (const char* name : {"kiln_batch_norm_stats", "kiln_batch_norm_apply", "kiln_batch_norm_backward_reduce",
                           "kiln_batch_norm_backward_dx", "kiln_layer_norm", "kiln_layer_norm_backward_dx",
                           "kiln_layer_norm_backward_params"}) {
    CAPTURE(name);
    REQUIRE(k.count(name) == 1);
    CHECK(k.at(name) == 1);
  }
}

TEST_CASE("nn::Sequential's BatchNorm2d + ReLU on the GPU: one fused op, same values as on the CPU") {
  Generator gen(80);
  nn::Sequential cpu_net(nn::BatchNorm2d(4), nn::ReLU()), gpu_net(nn::BatchNorm2d(4), nn::ReLU());
  gpu_net.to(kGpu);
  const Tensor x = randn({8, 4, 7, 9}, {}, &gen);
  for (int step = 0; step < 3; ++step) {
    const Tensor xs = add(mul(x, 1.0 + step), static_cast<double>(step));
    check_match(cpu_net(xs), gpu_net(xs.to(kGpu)), 5e-5, "train step " + std::to_string(step));
  }
  check_match(cpu_net.named_buffers()[0].second, gpu_net.named_buffers()[0].second, 1e-5, "running_mean");
  check_match(cpu_net.named_buffers()[1].second, gpu_net.named_buffers()[1].second, 1e-5, "running_var");
  cpu_net.eval();
  gpu_net.eval();
  check_match(cpu_net(x), gpu_net(x.to(kGpu)), 5e-5, "eval");
}

TEST_CASE("batch_norm and layer_norm on the GPU: errors for bad input name the op") {
  using kiln_test::message_of;
  const Tensor x = ones({4, 3, 2, 2}, {.device = kGpu}), c3 = ones({3}, {.device = kGpu});
  CHECK(message_of<ShapeError>([&] { batch_norm(x, {}, {}, ones({4}, {.device = kGpu}), {}, true); }) ==
        "[batch_norm] weight has shape (4,); expected (3,)");
  CHECK(message_of<ValueError>([&] { batch_norm(x, {}, {}, c3, c3, false); }) ==
        "[batch_norm] eval mode needs running_mean and running_var");
  CHECK(message_of<ValueError>([&] {
          batch_norm(ones({1, 3}, {.device = kGpu}), {}, {}, {}, {}, true);
        }) == "[batch_norm] training needs more than one value per channel; got input (1,3)");
  CHECK(
      message_of<DeviceError>([&] { batch_norm(x, ones({3}), ones({3}), {}, {}, true); }).starts_with("[batch_norm]"));
  CHECK(message_of<ShapeError>([&] { layer_norm(x, {2}, ones({3}, {.device = kGpu})); }) ==
        "[layer_norm] weight has shape (3,); expected (2,)");
}
