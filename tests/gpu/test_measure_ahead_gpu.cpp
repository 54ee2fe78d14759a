// A plan's cuBLASLt products measured ahead of the run (backend/cuda/gemm_lt_ahead.h): the
// shape-only pass lists them, prefetch_kernels measures them on its own thread and stores the
// choices, and the run then measures none of them and matches the CPU reference.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

#include "backend/cuda/gemm_lt_ahead.h"
#include "gpu_match.h"
#include "kiln/kiln.h"
#include "kiln/runtime/tuning.h"

using namespace kiln;
using kiln_test::kGpu;

TEST_CASE("prefetch_kernels measures a plan's cuBLASLt products ahead, and the run measures none of them") {
  const rt::TuneMode was = rt::tune_mode();
  rt::set_tune_mode(rt::TuneMode::auto_);
  // A depth of its own, so no earlier run sharing the test cache stored these products' choices.
  const std::int64_t k =
      300 + static_cast<std::int64_t>(std::chrono::steady_clock::now().time_since_epoch().count() % 397);
  CAPTURE(k);
  Generator gen(5);
  const Tensor x = randn({24, k}, {.device = kGpu}, &gen);
  Tensor w = randn({40, k}, {.device = kGpu}, &gen), b = randn({40}, {.device = kGpu}, &gen);
  w.requires_grad_();
  b.requires_grad_();
  Tensor y;
  auto work = [&] {
    w.zero_grad();
    b.zero_grad();
    y = linear(x, w, b, Activation::relu);
    sum(y).backward();
  };

  const KernelPlan plan = plan_kernels(work, kGpu);
  std::size_t products = 0;
  for (const KernelPlan::Measurement& m : plan.measurements)
    if (m.site == "cublaslt" && m.problem.find(" k" + std::to_string(k) + " ") != std::string::npos) ++products;
  CHECK(products >= 1);  // the forward with its bias and ReLU
  CHECK(plan.measurements.size() >= products);

  const std::uint64_t before = rt::tune_counters().measured;
  prefetch_kernels(plan, kGpu);
  const std::size_t ahead = kernels::wait_for_products_ahead();
  CHECK(ahead == plan.measurements.size());  // nothing launched a product meanwhile
  CHECK(rt::tune_counters().measured == before + ahead);

  work();  // the run: every choice is made already
  CHECK(rt::tune_counters().measured == before + ahead);
  const Tensor xc = x.to(Device::cpu()), wc = w.detach().to(Device::cpu()), bc = b.detach().to(Device::cpu());
  const Tensor ref = linear(xc, wc, bc, Activation::relu);
  kiln_test::check_match(ref, y.detach(), 2e-4, "linear after measuring ahead");
  // d(sum relu(x w^T + b))/dw = (y > 0)^T x.
  const Tensor mask = gt(ref, zeros_like(ref)).to(DType::f32);
  kiln_test::check_match(matmul(transpose(mask, 0, 1), xc), w.grad(), 2e-4, "weight gradient");
  kiln_test::check_match(sum(mask, {0}), b.grad(), 2e-4, "bias gradient");

  // A second plan of the same products lists none: their choices are remembered.
  CHECK(plan_kernels(work, kGpu).measurements.empty());
  rt::set_tune_mode(was);
}
