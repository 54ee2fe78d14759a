// The fused softmax cross-entropy on the GPU (kernel_templates/softmax.cu): forward and
// backward against the CPU reference for every floating dtype, reduction, label smoothing
// and ignore_index, warp rows (C <= 1024) and block rows; bit-identical repeats (the
// last-block counter resets itself, also across CUDA graph replays); out-of-range labels.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "gpu_match.h"
#include "kiln/kiln.h"

using namespace kiln;
using kiln_test::check_match;

namespace {

using kiln_test::kGpu;

// GPU (f32 accumulation, tree order) against the CPU (double, in order): f32 allows for
// sums over 1000 rows of 1000 classes; f16/bf16 one rounding of the storage type and a bit.
double ce_tolerance(DType t) {
  switch (t) {
    case DType::f16:
      return 2e-3;
    case DType::bf16:
      return 1e-2;
    case DType::f64:
      return 1e-12;
    default:
      return 2e-5;
  }
}

const char* reduction_name(Reduction r) {
  return r == Reduction::none ? "none" : r == Reduction::sum ? "sum" : "mean";
}

Tensor ce_normal(const Shape& s, std::uint64_t seed, double scale) {
  Generator g(seed);
  return mul(randn(s, {.dtype = DType::f64}, &g), scale);
}

// Labels in [0, c), every seventh one -100 when `ignored`.
Tensor make_labels(std::int64_t n, std::int64_t c, bool ignored, std::uint64_t seed) {
  Generator g(seed);
  std::vector<std::int64_t> v = randint(0, c, {n}, {}, &g).to_vector<std::int64_t>();
  if (ignored)
    for (std::size_t i = 0; i < v.size(); i += 7) v[i] = -100;
  return from_vector(v, {n});
}

using kiln_test::f64_bits;

}  // namespace

TEST_CASE("softmax_cross_entropy on the GPU matches the CPU: dtypes, reductions, smoothing, ignore_index, shapes") {
  struct Size {
    std::int64_t n, c;
  };
  const Size sizes[] = {{1, 10}, {1, 1000}, {1000, 10}, {1000, 1000}, {37, 1500}, {0, 10}};
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    for (const Size& sz : sizes) {
      const Tensor x = ce_normal({sz.n, sz.c}, 1, 3.0).to(t);
      for (bool ignored : {false, true}) {
        const Tensor labels = make_labels(sz.n, sz.c, ignored, 2);
        const std::optional<std::int64_t> ignore = ignored ? std::optional<std::int64_t>(-100) : std::nullopt;
        for (Reduction r : {Reduction::none, Reduction::sum, Reduction::mean}) {
          for (double eps : {0.0, 0.1}) {
            const std::string name = "cross_entropy(dtype=" + std::string(dtype_name(t)) + ", shape=" +
                                     shape_str(x.shape()) + ", reduction=" + reduction_name(r) +
                                     ", label_smoothing=" + std::to_string(eps) + (ignored ? ", ignore_index=-100)" : ")");
            Tensor xc = x.clone().requires_grad_(), xg = x.to(kGpu).requires_grad_();
            const Tensor yc = cross_entropy(xc, labels, r, eps, ignore);
            const Tensor yg = cross_entropy(xg, labels.to(kGpu), r, eps, ignore);
            check_match(yc, yg, ce_tolerance(t), name + " forward");
            Generator gen(3);
            const Tensor cot = randn(yc.shape(), {.dtype = t}, &gen);
            yc.backward(cot);
            yg.backward(cot.to(kGpu));
            check_match(xc.grad(), xg.grad(), ce_tolerance(t), name + " backward");
          }
        }
      }
    }
  }
}

TEST_CASE("softmax_cross_entropy on the GPU: the same call twice gives the same bits (the counter resets)") {
  for (DType t : {DType::f32, DType::f16, DType::f64}) {
    for (std::int64_t c : {10, 1000, 3000}) {
      const Tensor x = ce_normal({1000, c}, 4, 2.0).to(t).to(kGpu);
      const Tensor labels = make_labels(1000, c, true, 5).to(kGpu);
      for (Reduction r : {Reduction::sum, Reduction::mean}) {
        CAPTURE(dtype_name(t));
        CAPTURE(c);
        CAPTURE(reduction_name(r));
        const std::vector<std::uint64_t> first = f64_bits(cross_entropy(x, labels, r, 0.1, -100));
        for (int k = 0; k < 3; ++k) CHECK(f64_bits(cross_entropy(x, labels, r, 0.1, -100)) == first);
      }
    }
  }
}

TEST_CASE("softmax_cross_entropy in a compiled step: one kernel each way, replays match eager bit for bit") {
  Generator g(8);
  Tensor w = randn({32, 10}, {}, &g).to(kGpu).requires_grad_();
  auto fn = [&](const std::vector<Tensor>& in) {
    w.zero_grad();
    Tensor loss = cross_entropy(matmul(in[0], w), in[1], Reduction::mean, 0.1, -100);
    loss.backward();
    return std::vector<Tensor>{loss.detach(), w.grad()};
  };
  const Tensor x = randn({256, 32}, {}, &g).to(kGpu);
  const Tensor labels = make_labels(256, 10, true, 9).to(kGpu);
  std::vector<Tensor> eager = fn({x, labels});
  const std::vector<std::uint64_t> want_loss = f64_bits(eager[0]), want_grad = f64_bits(eager[1]);
  CompiledFunction cf = compile(fn);
  for (int k = 0; k < 20; ++k) {
    std::vector<Tensor> out = cf({x, labels});
    CAPTURE(k);
    CHECK(f64_bits(out[0]) == want_loss);
    CHECK(f64_bits(out[1]) == want_grad);
  }
  const CompileStats s = cf.stats();
  CHECK(s.replays == 18);
  REQUIRE(s.kernel_names_per_graph.size() == 1);
  const auto& names = s.kernel_names_per_graph[0];
  auto count = [&](const char* k) { return names.count(k) ? names.at(k) : std::size_t{0}; };
  CHECK(count("kiln_softmax_cross_entropy") == 1);
  CHECK(count("kiln_softmax_cross_entropy_backward") == 1);
  CHECK(count("kiln_softmax") == 0);
  CHECK(count("kiln_nll_forward") == 0);
  CHECK(count("kiln_nll_backward") == 0);
}

// Under autocast, 16-bit logits go to the fused op as they are, which gives the f32 loss (and
// takes its f32 gradient) as if they had been cast to f32: the same bits as the cast, and in a
// compiled step neither cast kernel.
TEST_CASE("softmax_cross_entropy of f16 and bf16 logits under autocast: an f32 loss with the cast's bits, no casts") {
  const Tensor labels = make_labels(300, 10, true, 12).to(kGpu);
  for (DType t : {DType::bf16, DType::f16})
    for (Reduction r : {Reduction::none, Reduction::sum, Reduction::mean})
      for (double eps : {0.0, 0.1}) {
        CAPTURE(dtype_name(t));
        CAPTURE(reduction_name(r));
        CAPTURE(eps);
        const Tensor x = ce_normal({300, 10}, 13, 3.0).to(t).to(kGpu);
        Tensor fused = x.clone().requires_grad_(), cast_first = x.clone().requires_grad_();
        Tensor loss;
        {
          AutocastGuard amp(t);
          loss = cross_entropy(fused, labels, r, eps, -100);
        }
        const Tensor want = cross_entropy(cast(cast_first, DType::f32), labels, r, eps, -100);
        CHECK(loss.dtype() == DType::f32);
        CHECK(f64_bits(loss) == f64_bits(want));
        Generator gen(14);
        const Tensor cot = randn(want.shape(), {}, &gen).to(kGpu);
        loss.backward(cot);
        want.backward(cot);
        CHECK(fused.grad().dtype() == t);
        CHECK(f64_bits(fused.grad()) == f64_bits(cast_first.grad()));
      }
  // The same step with the logits cast by hand has the two cast kernels this one does not.
  Generator g(15);
  Tensor w = randn({32, 10}, {}, &g).to(DType::bf16).to(kGpu).requires_grad_();
  auto step = [&](bool cast_first) {
    return [&w, cast_first](const std::vector<Tensor>& in) {
      w.zero_grad();
      Tensor loss;
      {
        AutocastGuard amp(DType::bf16);
        const Tensor logits = matmul(in[0], w);
        loss = cross_entropy(cast_first ? cast(logits, DType::f32) : logits, in[1], Reduction::mean, 0.1, -100);
      }
      loss.backward();
      return std::vector<Tensor>{loss.detach(), w.grad()};
    };
  };
  const Tensor x = randn({256, 32}, {}, &g).to(DType::bf16).to(kGpu);
  std::size_t pointwise[2] = {}, kernels[2] = {};
  for (bool cast_first : {false, true}) {
    CompiledFunction cf = compile(step(cast_first));
    for (int k = 0; k < 3; ++k) cf({x, narrow(labels, 0, 0, 256)});
    const CompileStats s = cf.stats();
    REQUIRE(s.kernel_names_per_graph.size() == 1);
    const auto& names = s.kernel_names_per_graph[0];
    CHECK(names.at("kiln_softmax_cross_entropy") == 1);
    for (const auto& [name, n] : names) {
      kernels[cast_first] += n;
      if (name == "kiln_unary" || name == "kiln_fused") pointwise[cast_first] += n;  // a cast, alone or fused
    }
  }
  CHECK(pointwise[1] == pointwise[0] + 2);
  CHECK(kernels[1] == kernels[0] + 2);
}

TEST_CASE("softmax_cross_entropy on the GPU: an out-of-range label gives a NaN loss and a zero gradient") {
  const Tensor labels = from_vector(std::vector<std::int64_t>{1, 7, 0}, {3}).to(kGpu);
  Tensor x = ce_normal({3, 4}, 10, 1.0).to(DType::f32).to(kGpu).requires_grad_();
  const Tensor loss = cross_entropy(x, labels, Reduction::none, 0.1);
  const std::vector<float> l = loss.to(Device::cpu()).to_vector<float>();
  CHECK(std::isfinite(l[0]));
  CHECK(std::isnan(l[1]));
  CHECK(std::isfinite(l[2]));
  loss.backward(ones({3}, {.device = kGpu}));
  const std::vector<float> gr = x.grad().to(Device::cpu()).to_vector<float>();
  for (int c = 0; c < 4; ++c) {
    CHECK(gr[static_cast<std::size_t>(4 + c)] == 0);
    CHECK(gr[static_cast<std::size_t>(c)] != 0);
  }
  CHECK(std::isnan(cross_entropy(x, labels, Reduction::sum).item<float>()));
}

TEST_CASE("softmax_cross_entropy: gradient checks in f64 on the GPU") {
  const Tensor x = ce_normal({5, 7}, 11, 2.0).to(kGpu);
  const Tensor labels = from_vector(std::vector<std::int64_t>{6, -1, 3, 3, 0}, {5}).to(kGpu);
  for (Reduction r : {Reduction::none, Reduction::sum, Reduction::mean})
    for (double eps : {0.0, 0.2}) {
      const testing::GradcheckResult res =
          testing::gradcheck([&](const auto& v) { return cross_entropy(v[0], labels, r, eps, -1); }, {x});
      CHECK_MESSAGE(res.ok, reduction_name(r) << " eps " << eps << ": " << res.message);
    }
}

// loss.backward() hands on the gradient the forward wrote for a loss gradient of 1, where the
// forward knows it (reduction sum, or mean with no label ignored): the backward kernel's bits,
// an out-of-range label's zeros included, and a compiled step without the backward kernel.
TEST_CASE(
    "softmax_cross_entropy on the GPU: loss.backward() takes the forward's gradient, the backward kernel's bits") {
  const Tensor labels = make_labels(300, 10, false, 16).to(kGpu);
  const Tensor bad = from_vector(std::vector<std::int64_t>{1, 17, 0}, {3}).to(kGpu);
  for (DType t : {DType::f32, DType::bf16, DType::f64})
    for (Reduction r : {Reduction::sum, Reduction::mean})
      for (double eps : {0.0, 0.1}) {
        CAPTURE(dtype_name(t));
        CAPTURE(reduction_name(r));
        CAPTURE(eps);
        const Tensor x = ce_normal({300, 10}, 17, 3.0).to(t).to(kGpu);
        Tensor implicit = x.clone().requires_grad_(), given = x.clone().requires_grad_();
        const Tensor loss = cross_entropy(implicit, labels, r, eps);
        loss.backward();
        cross_entropy(given, labels, r, eps).backward(ones({}, {.dtype = loss.dtype(), .device = kGpu}));
        CHECK(f64_bits(implicit.grad()) == f64_bits(given.grad()));
        Tensor xb = narrow(x, 0, 0, 3).clone().requires_grad_(), xg = xb.detach().clone().requires_grad_();
        cross_entropy(xb, bad, r, eps).backward();
        cross_entropy(xg, bad, r, eps).backward(ones({}, {.dtype = loss.dtype(), .device = kGpu}));
        CHECK(f64_bits(xb.grad()) == f64_bits(xg.grad()));
      }
  Generator g(18);
  Tensor w = randn({32, 10}, {}, &g).to(kGpu).requires_grad_();
  auto step = [&](const std::vector<Tensor>& in) {
    w.zero_grad();
    Tensor loss = cross_entropy(matmul(in[0], w), in[1], Reduction::mean, 0.1);
    loss.backward();
    return std::vector<Tensor>{loss.detach(), w.grad()};
  };
  const Tensor x = randn({256, 32}, {}, &g).to(kGpu), l256 = narrow(labels, 0, 0, 256);
  const std::vector<Tensor> eager = step({x, l256});
  CompiledFunction cf = compile(step);
  for (int k = 0; k < 4; ++k) {
    const std::vector<Tensor> out = cf({x, l256});
    CHECK(f64_bits(out[0]) == f64_bits(eager[0]));
    CHECK(f64_bits(out[1]) == f64_bits(eager[1]));
  }
  const CompileStats stats = cf.stats();
  REQUIRE(stats.kernel_names_per_graph.size() == 1);
  const std::map<std::string, std::size_t>& names = stats.kernel_names_per_graph[0];
  CHECK(names.count("kiln_softmax_cross_entropy") == 1);
  CHECK(names.count("kiln_softmax_cross_entropy_backward") == 0);
}
