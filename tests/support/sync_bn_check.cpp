// `kiln_test_helper sync-bn`, run by every rank under kiln-run: dist::SyncBatchNorm on this
// rank's rows of a global batch (parameter gradients averaged by a GradReducer) against batch_norm
// on the whole global batch, which each rank computes alone on its own GPU. Checks outputs,
// running statistics and the gradients of input, weight and bias, eager and compiled (three calls:
// eager, capture, replay), then eval mode, in f64, f32, bf16 and f16 (f32 parameters, as under
// autocast), with and without the fused ReLU, and with unequal rows per rank. Prints one line per
// rank; exit 0 when everything matched.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kiln/dist.h"
#include "kiln/dist/grad_reducer.h"
#include "kiln/dist/sync_batch_norm.h"
#include "kiln/kiln.h"

namespace {

using namespace kiln;

constexpr std::int64_t kC = 3, kH = 5, kW = 6;

struct SyncBnCase {
  DType dtype;
  Activation act;
  bool compiled;
  bool unequal;  // rank r holds 2 + r rows (else 4 each)
  std::string name() const {
    return std::string(dtype_name(dtype)) + (act == Activation::relu ? "+relu" : "") +
           (compiled ? " compiled" : " eager") + (unequal ? " unequal rows" : "");
  }
};

struct Checker {
  int failures = 0, checks = 0;
  double worst = 0;
  void near(const std::string& what, const Tensor& got, const Tensor& want, double tol) {
    ++checks;
    const Tensor a = got.to(Device::cpu()).to(DType::f64), b = want.to(Device::cpu()).to(DType::f64);
    const double scale = std::max(1.0, max(abs(b)).item<double>());
    const double err = max(abs(a - b)).item<double>() / scale;
    worst = std::max(worst, err / tol);
    if (!(err <= tol)) {
      ++failures;
      std::printf("MISMATCH %s: max error %.3g (relative to %.3g), sync_bn_tolerance %.3g\n", what.c_str(), err, scale, tol);
    }
  }
};

double sync_bn_tolerance(DType t) { return t == DType::f64 ? 1e-10 : t == DType::f32 ? 1e-4 : 3e-2; }

void run_case(const SyncBnCase& k, dist::ProcessGroup& pg, Checker& check) {
  const int world = pg.world_size(), rank = pg.rank();
  const Device dev = pg.device();
  std::vector<std::int64_t> begin{0};
  for (int r = 0; r < world; ++r) begin.push_back(begin.back() + (k.unequal ? 2 + r : 4));
  const std::int64_t n_all = begin.back(), lo = begin[static_cast<std::size_t>(rank)];
  const std::int64_t n_mine = begin[static_cast<std::size_t>(rank) + 1] - lo;
  // The same global data on every rank; mean well away from 0, as after a conv without bias.
  Generator gen(5);
  const Tensor x = (randn({n_all, kC, kH, kW}, {}, &gen) * 2.0 + 3.0).to(k.dtype).to(dev);
  const Tensor c = randn({n_all, kC, kH, kW}, {}, &gen).to(k.dtype).to(dev);
  const Tensor w0 = (rand({kC}, {}, &gen) + 0.5).to(dev), b0 = randn({kC}, {}, &gen).to(dev);
  // Loss of a rank: sum(y_r * c_r) * scale, a mean over its rows (DDP's convention) or over all.
  const double scale = k.unequal ? 1.0 / static_cast<double>(n_all) : 1.0 / static_cast<double>(n_mine);

  // Reference: batch_norm on the global batch, loss sum(y * c) / n_all.
  nn::BatchNorm2d ref(kC);
  ref.to(dev);
  nn::BatchNorm2d mine_bn(kC);
  mine_bn.to(dev);
  {
    NoGradGuard no_grad;
    for (nn::BatchNorm2d* m : {&ref, &mine_bn}) {
      std::vector<Tensor> p = m->parameters();
      p[0].copy_(w0);
      p[1].copy_(b0);
    }
  }
  dist::SyncBatchNorm mine(mine_bn, pg);
  dist::GradReducer reducer(pg, mine.parameters());

  auto ref_step = [&] {
    ref.zero_grad();
    Tensor xr = x.detach();
    xr.requires_grad_(true);
    Tensor y = ref.forward(xr, k.act);
    (sum((y * c).to(DType::f32)) / static_cast<double>(n_all)).backward();
    return std::vector<Tensor>{y.detach(), xr.grad(), ref.parameters()[0].grad(), ref.parameters()[1].grad()};
  };
  auto sync_step = [&](const std::vector<Tensor>& in) {
    for (Tensor p : mine.parameters()) p.zero_grad();
    Tensor xr = in[0].detach();
    xr.requires_grad_(true);
    Tensor y = mine.forward(xr, k.act);
    (sum((y * in[1]).to(DType::f32)) * scale).backward();
    reducer.finish();
    return std::vector<Tensor>{y.detach(), xr.grad(), mine.parameters()[0].grad(), mine.parameters()[1].grad()};
  };
  CompiledFunction compiled = compile(sync_step);
  const Tensor x_mine = narrow(x, 0, lo, n_mine).contiguous(), c_mine = narrow(c, 0, lo, n_mine).contiguous();
  const double tol = sync_bn_tolerance(k.dtype);
  // dx of the sync run is that of the sum of all ranks' losses: (scale * n_all) times the reference's.
  const double dx_factor = scale * static_cast<double>(n_all), param_factor = dx_factor / world;
  for (int call = 0; call < 3; ++call) {
    const std::string at = k.name() + " call " + std::to_string(call) + ": ";
    const std::vector<Tensor> want = ref_step();
    const std::vector<Tensor> got = k.compiled ? compiled({x_mine, c_mine}) : sync_step({x_mine, c_mine});
    check.near(at + "output", got[0], narrow(want[0], 0, lo, n_mine), tol);
    check.near(at + "input gradient", got[1], narrow(want[1], 0, lo, n_mine) * dx_factor, tol);
    // Parameters, their gradients and the running statistics are f32 (BatchNorm2d's) in every case.
    const double tol_f32 = std::max(tol, 1e-5);
    check.near(at + "weight gradient", got[2], want[2] * param_factor, tol_f32);
    check.near(at + "bias gradient", got[3], want[3] * param_factor, tol_f32);
    const nn::NamedTensors a = mine.named_buffers(), b = ref.named_buffers();
    for (std::size_t i = 0; i < a.size(); ++i) check.near(at + a[i].first, a[i].second, b[i].second, tol_f32);
    pg.watch("the sync-bn check");
  }
  // Eval mode: the running statistics, no communication.
  mine.eval();
  ref.eval();
  {
    NoGradGuard no_grad;
    check.near(k.name() + " eval output", mine.forward(x_mine, k.act), narrow(ref.forward(x, k.act), 0, lo, n_mine),
               tol);
  }
  if (k.compiled && compiled.stats().captures != 1) {
    ++check.failures;
    std::printf("MISMATCH %s: %llu captures, expected 1\n", k.name().c_str(),
                static_cast<unsigned long long>(compiled.stats().captures));
  }
}

}  // namespace

int sync_bn_check() {
  dist::ProcessGroup pg = dist::ProcessGroup::init();
  Checker check;
  for (DType dt : {DType::f64, DType::f32, DType::bf16, DType::f16})
    for (Activation act : {Activation::none, Activation::relu})
      for (bool compiled : {false, true}) run_case({dt, act, compiled, false}, pg, check);
  run_case({DType::f64, Activation::relu, false, true}, pg, check);
  run_case({DType::f32, Activation::none, true, true}, pg, check);
  synchronize(pg.device());
  pg.check();
  std::printf("sync-bn rank %d of %d: %d checks, %d mismatches, worst error %.3g of its sync_bn_tolerance\n", pg.rank(),
              pg.world_size(), check.checks, check.failures, check.worst);
  return check.failures == 0 ? 0 : 1;
}
