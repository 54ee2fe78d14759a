// dropout as a composite: x * bernoulli mask * 1/(1 - p). The mask comes from the Philox
// bernoulli of kiln/random.h, so one seed gives one mask on either device, and the
// gradient g * mask / (1 - p) comes from mul's vjp.
#include <string>

#include "kiln/nn_functional.h"
#include "core/registry.h"

namespace kiln {

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  if (!(p >= 0.0 && p <= 1.0)) throw ValueError("[dropout] p must be in [0, 1]; got " + std::to_string(p));
  if (!is_floating(x.dtype()))
    throw DTypeError("[dropout] needs a floating tensor; got " + std::string(dtype_name(x.dtype())));
  if (!training || p == 0.0) return x;
  const TensorOptions opts{.dtype = x.dtype(), .device = x.device()};
  if (p == 1.0) return mul(x, zeros(x.shape(), opts));
  // The mask is 0/1, so x * mask is exact and the scale rounds once, in the compute type.
  const Tensor keep = bernoulli(x.shape(), 1.0 - p, opts, gen);
  return mul(mul(x, keep), 1.0 / (1.0 - p));
}

}  // namespace kiln
