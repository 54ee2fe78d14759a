// The CPU fast paths (im2col + BLAS convolutions, threaded max pooling and batch norm)
// against the ops' reference loops (OpDef::cpu_reference): every registry test case, then
// odd convolution, pooling and norm shapes forward and backward in f32 and f64, f64
// gradients against finite differences, the thread pool itself and the GEMMs it splits.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "consistency_cases.h"
#include "consistency_compare.h"
#include "core/cpu/gemm_cpu.h"
#include "core/cpu/parallel.h"
#include "gradcheck.h"

using namespace kiln;

namespace {

// Runs f once on the fast path and once on the references; the outputs, compared.
using Outputs = std::vector<Tensor>;
std::string fast_vs_reference(const std::function<Outputs()>& f, double tol_scale) {
  Outputs fast = f(), ref;
  {
    CpuReferenceGuard reference;
    ref = f();
  }
  REQUIRE(fast.size() == ref.size());
  std::string diff;
  for (std::size_t k = 0; k < fast.size(); ++k) {
    const std::string d = consistency::compare_outputs(ref[k], fast[k], 5, tol_scale);
    if (!d.empty()) diff += "\n  output " + std::to_string(k) + ": " + d;
  }
  return diff;
}

Tensor random(const Shape& s, DType dt, std::uint64_t seed, double low = -2, double high = 2) {
  Generator g(seed);
  return (rand(s, {.dtype = DType::f64}, &g) * (high - low) + low).to(dt);
}

// x with every seventh element NaN.
Tensor with_nans(const Tensor& x) {
  std::vector<double> v = x.to_vector<double>();
  for (std::size_t i = 3; i < v.size(); i += 7) v[i] = std::nan("");
  return from_vector(v, x.shape(), {.dtype = x.dtype()});
}

// f32 sums run in f32 on the fast path and in f64 in the reference; they differ by the
// rounding of a sum over many terms.
double scale_for(DType dt) { return dt == DType::f32 ? 20.0 : 100.0; }

struct ConvCase {
  Shape x, w;
  Conv2dOptions o;
};

// Output, then the gradients of x and w for a fixed cotangent.
Outputs conv_pass(const ConvCase& c, DType dt, bool view) {
  Tensor x = random(c.x, dt, 1), w = random(c.w, dt, 2);
  if (view) x = transpose(transpose(x, 2, 3).contiguous(), 2, 3);  // same values, strided
  x.requires_grad_();
  w.requires_grad_();
  Tensor y = conv2d(x, w, {}, c.o);
  y.backward(random(y.shape(), dt, 3));
  return {y.detach(), x.grad(), w.grad()};
}

}  // namespace

TEST_CASE("cpu fast paths: every registry case of an op with a reference matches it") {
  std::set<std::string> with_reference;
  for (const OpDef* op : registered_ops()) {
    if (!op->cpu_reference) continue;
    with_reference.insert(op->name);
    int compared = 0;
    for (const consistency::Case& c : consistency::make_cases(*op)) {
      Generator gen(7);
      std::vector<Tensor> in;
      for (std::size_t i = 0; i < c.inputs.size(); ++i)
        in.push_back(
            consistency::make_input(c.inputs[i], c.dtype, op->test, c.special, static_cast<int>(i), gen, Device::cpu())
                .cpu);
      // Ops that update inputs in place (running statistics) get fresh copies for each run.
      auto run = [&] {
        std::vector<Tensor> copies;
        for (const Tensor& t : in) copies.push_back(t.clone());
        return dispatch(*op, copies, c.attrs);
      };
      std::string diff;
      try {
        diff = fast_vs_reference(run, op->test.tolerance_scale * 4);
      } catch (const Error&) {
        continue;  // a case the op rejects, on both paths alike (the registry tests check errors)
      }
      ++compared;
      CHECK_MESSAGE(diff.empty(), c.name << diff);
    }
    CHECK_MESSAGE(compared > 0, op->name);
  }
  const std::set<std::string> expected{
      "conv2d",     "conv2d_grad_input",  "conv2d_grad_weight", "max_pool2d", "max_pool2d_backward",
      "batch_norm", "batch_norm_backward"};
  CHECK(with_reference == expected);
}

TEST_CASE("cpu fast paths: conv2d forward and gradients on odd shapes, f32 and f64") {
  using V = std::vector<std::int64_t>;
  const std::vector<ConvCase> cases{
      {{2, 3, 7, 5}, {4, 3, 3, 2}, {}},
      {{1, 3, 9, 6}, {5, 3, 3, 3}, {.stride = V{2, 1}, .padding = V{1, 2}}},
      {{3, 4, 8, 11}, {6, 2, 3, 2}, {.padding = V{2}, .dilation = V{2, 1}, .groups = 2}},
      {{2, 6, 5, 5}, {6, 1, 2, 2}, {.stride = V{2}, .groups = 6}},  // depthwise
      {{1, 1, 28, 28}, {8, 1, 5, 5}, {.padding = V{2}}},            // the cnn's first layer, batch 1
      {{30, 16, 32, 32}, {8, 16, 3, 3}, {.padding = V{1}}},         // several chunks of samples
      // 8+ channels per group: oneDNN's convolutions where kiln was built with it.
      {{3, 16, 9, 11}, {16, 8, 3, 3}, {.stride = V{2}, .padding = V{1, 2}, .dilation = V{1, 2}, .groups = 2}},
      {{2, 8, 9, 9}, {16, 8, 5, 5}, {.padding = V{2}}},  // as the cnn's second layer, smaller
      {{2, 8, 10, 10}, {8, 8, 3, 3}, {.stride = V{3}}},      // the last input row unused
  };
  for (DType dt : {DType::f32, DType::f64})
    for (const ConvCase& c : cases)
      for (bool view : {false, true}) {
        const std::string diff = fast_vs_reference([&] { return conv_pass(c, dt, view); }, scale_for(dt));
        CHECK_MESSAGE(diff.empty(), "conv2d(dtype=" << dtype_name(dt) << ", x=" << shape_str(c.x)
                                                    << ", w=" << shape_str(c.w) << ", view=" << view << ")" << diff);
      }
}

TEST_CASE("cpu fast paths: max_pool2d forward and backward agree exactly, ties and NaN included") {
  using V = std::vector<std::int64_t>;
  struct PoolCase {
    Shape x;
    V kernel, stride, padding, dilation;
  };
  const std::vector<PoolCase> cases{{{2, 3, 8, 8}, {2}, {}, {0}, {1}},
                                    {{1, 2, 7, 9}, {2}, {}, {0}, {1}},  // 2x2 windows, a row and column left over
                                    {{1, 2, 7, 5}, {3}, {2}, {1}, {1}},
                                    {{2, 2, 9, 6}, {2, 3}, {1}, {0}, {2, 1}},
                                    {{1, 1, 5, 9}, {3, 2}, {2, 3}, {1, 0}, {1}}};
  for (DType dt : {DType::f32, DType::f64})
    for (const PoolCase& c : cases)
      for (bool nan : {false, true}) {
        auto run = [&] {
          // Values from a few integers, so windows hold ties; one NaN per plane when asked.
          Tensor x = floor(random(c.x, dt, 4, -3, 3));
          if (nan) x = with_nans(x);
          x.requires_grad_();
          Tensor y = max_pool2d(x, c.kernel, c.stride, c.padding, c.dilation);
          y.backward(random(y.shape(), dt, 5));
          const Tensor idx = dispatch(
              *find_op("max_pool2d"), std::vector<Tensor>{x.detach()},
              Attrs{{"kernel", c.kernel}, {"stride", c.stride}, {"padding", c.padding}, {"dilation", c.dilation}})[1];
          return Outputs{y.detach(), x.grad(), idx};
        };
        const std::string diff = fast_vs_reference(run, 0.0);
        CHECK_MESSAGE(diff.empty(), "max_pool2d(dtype=" << dtype_name(dt) << ", x=" << shape_str(c.x) << ")" << diff);
      }
}

TEST_CASE("cpu fast paths: max_pool2d_backward ignores indices outside their window, as the reference does") {
  const Shape in{2, 3, 6, 5};
  const Attrs attrs{{"kernel", std::vector<std::int64_t>{2}},
                    {"input_shape", std::vector<std::int64_t>(in.begin(), in.end())}};
  for (DType dt : {DType::f32, DType::f64}) {
    auto run = [&] {
      const Tensor g = random({2, 3, 3, 2}, dt, 6);
      const Tensor idx = floor(random({2, 3, 3, 2}, DType::f64, 7, -2, 32)).to(DType::i64);
      return dispatch(*find_op("max_pool2d_backward"), std::vector<Tensor>{g, idx}, attrs);
    };
    const std::string diff = fast_vs_reference(run, 0.0);
    CHECK_MESSAGE(diff.empty(), dtype_name(dt) << diff);
  }
}

TEST_CASE("cpu fast paths: batch_norm forward, running statistics and gradients, f32 and f64") {
  for (DType dt : {DType::f32, DType::f64})
    for (const Shape& s : {Shape{2, 3, 5, 7}, Shape{1, 4, 3, 9}, Shape{6, 3}, Shape{5, 2, 17}})
      for (bool training : {true, false})
        for (bool relu : {false, true})
          for (bool affine : {true, false}) {
            auto run = [&] {
              Tensor x = random(s, dt, 8).requires_grad_();
              Tensor w = affine ? random({s[1]}, dt, 9).requires_grad_() : Tensor();
              Tensor b = affine ? random({s[1]}, dt, 10).requires_grad_() : Tensor();
              Tensor rm = random({s[1]}, dt, 11), rv = random({s[1]}, dt, 12, 0.5, 2);
              Tensor y = batch_norm(x, rm, rv, w, b, training, 0.3, 1e-5, relu ? Activation::relu : Activation::none);
              y.backward(random(s, dt, 13));
              Outputs r{y.detach(), x.grad(), rm, rv};
              if (affine) r.insert(r.end(), {w.grad(), b.grad()});
              return r;
            };
            const std::string diff = fast_vs_reference(run, 10.0);
            CHECK_MESSAGE(diff.empty(), "batch_norm(dtype=" << dtype_name(dt) << ", x=" << shape_str(s)
                                                            << ", training=" << training << ", relu=" << relu
                                                            << ", affine=" << affine << ")" << diff);
          }
}

TEST_CASE("cpu fast paths: f64 gradients of the fast conv, pool and norm match finite differences") {
  using V = std::vector<std::int64_t>;
  const Tensor x = random({2, 4, 6, 5}, DType::f64, 14), w = random({6, 2, 3, 2}, DType::f64, 15);
  auto conv = [](const std::vector<Tensor>& v) {
    return conv2d(v[0], v[1], {}, {.stride = V{2, 1}, .padding = V{1}, .dilation = V{1, 2}, .groups = 2});
  };
  auto r = testing::gradcheck(conv, {x, w});
  CHECK_MESSAGE(r.ok, "conv2d: " << r.message);
  // Distinct values keep the argmax away from ties, where finite differences do not apply.
  std::vector<double> v(2 * 3 * 7 * 5);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i % 11) * 0.37 + 1e-4 * static_cast<double>(i);
  const Tensor xp = from_vector(v, {2, 3, 7, 5}, {.dtype = DType::f64});
  r = testing::gradcheck([](const std::vector<Tensor>& v) { return max_pool2d(v[0], {3}, {2}, {1}); }, {xp});
  CHECK_MESSAGE(r.ok, "max_pool2d: " << r.message);
  const Tensor xb = random({3, 2, 4, 5}, DType::f64, 17), wb = random({2}, DType::f64, 18),
               bb = random({2}, DType::f64, 19);
  r = testing::gradcheck(
      [](const std::vector<Tensor>& v) {
        return batch_norm(v[0], {}, {}, v[1], v[2], true, 0.1, 1e-5, Activation::none);
      },
      {xb, wb, bb});
  CHECK_MESSAGE(r.ok, "batch_norm: " << r.message);
}

TEST_CASE("cpu::parallel_for covers the range once, runs nested calls inline and rethrows") {
  for (std::int64_t n : {0, 1, 7, 1000}) {
    std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
    cpu::parallel_for(n, 3, [&](std::int64_t b, std::int64_t e) {
      CHECK(b < e);
      for (std::int64_t i = b; i < e; ++i) hits[static_cast<std::size_t>(i)]++;
    });
    CHECK(std::all_of(hits.begin(), hits.end(), [](const std::atomic<int>& h) { return h.load() == 1; }));
  }
  std::atomic<std::int64_t> total{0};
  cpu::parallel_for(8, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i)
      cpu::parallel_for(10, 1, [&](std::int64_t b2, std::int64_t e2) { total += e2 - b2; });
  });
  CHECK(total.load() == 80);
  CHECK_THROWS_AS(cpu::parallel_for(100, 1,
                                    [](std::int64_t b, std::int64_t) {
                                      if (b > 0 || kiln::cpu::num_threads() == 1) throw std::runtime_error("boom");
                                    }),
                  std::runtime_error);
}

TEST_CASE("cpu::gemm split over threads matches the blocked loops, by columns and by rows, strided and batched") {
  struct Case {
    std::int64_t batch, m, n, k;
  };
  for (DType dt : {DType::f32, DType::f64})
    for (const Case& s : {Case{2, 150, 300, 70}, Case{3, 300, 130, 90}}) {
      // A stored transposed (column-major), B row-major, C with a padded row stride.
      const Tensor a = random({s.batch, s.k, s.m}, dt, 20), b = random({s.batch, s.k, s.n}, dt, 21);
      const std::int64_t ldc = s.n + 3;
      Tensor c_split = random({s.batch, s.m, ldc}, dt, 22), c_ref = c_split.clone();
      const cpu::GemmShape shape{s.batch, s.m, s.n, s.k};
      const cpu::GemmOperand pa{a.data_ptr(), s.k * s.m, 1, s.m}, pb{b.data_ptr(), s.k * s.n, s.n, 1};
      cpu::gemm(dt, shape, 0.5, pa, pb, 2.0, {c_split.data_ptr(), s.m * ldc, ldc, 1});
      cpu::gemm_blocked(dt, shape, 0.5, pa, pb, 2.0, {c_ref.data_ptr(), s.m * ldc, ldc, 1});
      const std::string diff = consistency::compare_outputs(c_ref, c_split, 5, dt == DType::f32 ? 50 : 1000);
      CHECK_MESSAGE(diff.empty(), dtype_name(dt) << " m=" << s.m << " n=" << s.n << diff);
    }
}
