// A shape-only pass's list of kernels: each once, in the order first asked for, those asked for
// only inside a LateRequests scope (the tuner's alternatives to its first pick) marked late.
#include <doctest/doctest.h>

#include <vector>

#include "kiln/runtime/kernel_plan.h"
#include "kiln/runtime/kernel_registry.h"

using namespace kiln;
using namespace kiln::rt;

namespace {

std::vector<const KernelSpec*> specs_of(const std::vector<KernelRequest>& requests) {
  std::vector<const KernelSpec*> out;
  for (const KernelRequest& r : requests) out.push_back(r.spec);
  return out;
}

}  // namespace

TEST_CASE("a pass marks late requests, and a later plain request of one unmarks it") {
  KernelSpec a, b, c, d;  // only their addresses name them here
  const DTypes f32{DType::f32};
  ShapeOnlyPass pass;
  record_request(a, f32, 0, 0);
  {
    const LateRequests late;
    record_request(b, f32, 0, 0);
    record_request(c, f32, 0, 0);
    record_request(a, f32, 0, 0);  // already listed: stays where it is
    {
      const LateRequests nested;
      record_request(d, f32, 0, 0);
    }
    record_request(d, f32, 1, 0);  // still late after the nested scope closed; another variant
  }
  record_request(c, f32, 0, 0);  // the run needs it after all
  record_request(c, f32, 0, 0);
  const std::vector<KernelRequest> got = pass.requests();
  CHECK(specs_of(got) == std::vector<const KernelSpec*>{&a, &b, &c, &d, &d});
  REQUIRE(got.size() == 5);
  CHECK_FALSE(got[0].late);  // asked for plainly first
  CHECK(got[1].late);
  CHECK_FALSE(got[2].late);  // the run needs it after all
  CHECK(got[3].late);
  CHECK(got[4].late);
  CHECK(got[3].variant == 0);
  CHECK(got[4].variant == 1);
}

TEST_CASE("outside a pass nothing is recorded, late or not") {
  KernelSpec a;
  const LateRequests late;
  record_request(a, DTypes{DType::f32}, 0, 0);
  ShapeOnlyPass pass;
  CHECK(pass.requests().empty());
}
