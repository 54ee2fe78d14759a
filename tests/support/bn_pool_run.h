#pragma once
// batch_norm_max_pool2d or batch_norm then max_pool2d, forward and backward on fresh leaves and
// running statistics, for the suites that compare the two (engine and GPU).
#include <cstdint>
#include <vector>

#include "kiln/kiln.h"
#include "test_values.h"

namespace kiln_test {

struct PoolRun {
  kiln::Tensor y, running_mean, running_var;
  std::vector<kiln::Tensor> grads;  // of x, weight, bias
};

// Running statistics in `stats` on x's device (momentum 0.3); the backward of sum(y * cot), y
// taken in cot's dtype.
inline PoolRun run_bn_pool(bool fused, const kiln::Tensor& x, const kiln::Tensor& w, const kiln::Tensor& b,
                           bool training, kiln::Activation act, const std::vector<std::int64_t>& kernel,
                           const kiln::Tensor& cot, kiln::DType stats) {
  using namespace kiln;
  const std::int64_t c = x.shape()[1];
  PoolRun r{Tensor(),
            random_f64({c}, 7).to(stats).to(x.device()),
            add(random_f64({c}, 8, 0.1), 1.0).to(stats).to(x.device()),
            {}};
  std::vector<Tensor> leaves;
  for (const Tensor& t : {x, w, b}) leaves.push_back(t.detach().clone().requires_grad_());
  r.y = fused ? batch_norm_max_pool2d(leaves[0], r.running_mean, r.running_var, leaves[1], leaves[2], training, 0.3,
                                      1e-5, act, kernel)
              : max_pool2d(batch_norm(leaves[0], r.running_mean, r.running_var, leaves[1], leaves[2], training, 0.3,
                                      1e-5, act),
                           kernel);
  sum(mul(r.y.to(cot.dtype()), cot)).backward();
  for (const Tensor& l : leaves) r.grads.push_back(l.grad());
  return r;
}

}  // namespace kiln_test
