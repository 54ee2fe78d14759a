// The registry between a conv's channel sums and the batch norm that takes them
// (engine/ops/conv_totals.h, kiln::ConvStatsForBatchNorm), without a GPU: sums are kept only
// under a scope, taken once and only for exactly the tensor they were kept for, unwritten since,
// and dropped when the outermost scope ends. The GPU tests check the sums themselves.
#include <doctest/doctest.h>

#include "kiln/kiln.h"
#include "ops/conv_totals.h"

using namespace kiln;

namespace {

Tensor some_totals() { return zeros({2, 3}, {.dtype = DType::f64}); }

}  // namespace

TEST_CASE("conv totals: kept under a scope, taken once, for exactly the conv's output") {
  CHECK_FALSE(conv_totals::wanted());
  const Tensor y = zeros({2, 3, 4, 4});
  {
    const ConvStatsForBatchNorm scope;
    CHECK(conv_totals::wanted());
    const Tensor totals = some_totals();
    conv_totals::keep(y, totals);
    CHECK_FALSE(conv_totals::take(zeros({2, 3, 4, 4})).defined());    // another tensor of the shape
    CHECK_FALSE(conv_totals::take(y.reshape({2, 3, 16})).defined());  // a view of another shape
    const Tensor taken = conv_totals::take(y);
    REQUIRE(taken.defined());
    CHECK(taken.is_same(totals));
    CHECK_FALSE(conv_totals::take(y).defined());  // taken once
  }
  CHECK_FALSE(conv_totals::wanted());
}

TEST_CASE("conv totals: an output written since, or a later view of it, takes nothing") {
  const ConvStatsForBatchNorm scope;
  Tensor y = zeros({2, 3, 4, 4});
  conv_totals::keep(y, some_totals());
  y.mul_(2.0);  // the sums were of the values before
  CHECK_FALSE(conv_totals::take(y).defined());
  const Tensor x = zeros({2, 3, 4, 4});
  conv_totals::keep(x, some_totals());
  CHECK_FALSE(conv_totals::take(transpose(x, 2, 3)).defined());  // not contiguous
  CHECK(conv_totals::take(x).defined());
}

TEST_CASE("conv totals: nested scopes keep the sums until the outermost one ends") {
  const Tensor y = zeros({1, 2, 3, 3});
  {
    const ConvStatsForBatchNorm outer;
    {
      const ConvStatsForBatchNorm inner;
      conv_totals::keep(y, some_totals());
    }
    CHECK(conv_totals::wanted());
    CHECK(conv_totals::take(y).defined());
    conv_totals::keep(y, some_totals());
  }
  const ConvStatsForBatchNorm again;
  CHECK_FALSE(conv_totals::take(y).defined());  // dropped with the outer scope
}
