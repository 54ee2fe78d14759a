// The consistency suite (tests/gpu) compares an op only on cases the CPU accepts: every op
// with a GPU path must declare test hints that give it at least one such case.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "consistency_cases.h"

using namespace kiln;
using namespace consistency;

TEST_CASE("every op with a GPU path has consistency cases the CPU accepts") {
  for (const OpDef* op : registered_ops()) {
    if (!op->gpu) continue;
    int accepted = 0;
    std::string last_error;
    for (const Case& c : make_cases(*op)) {
      if (c.special) continue;
      Generator gen(42);
      std::vector<Tensor> in;
      for (std::size_t i = 0; i < c.inputs.size(); ++i)
        in.push_back(make_input(c.inputs[i], c.dtype, op->test, false, static_cast<int>(i), gen, Device::cpu()).cpu);
      Attrs attrs = c.attrs;
      if (op->num_inputs == 0) attrs.set("device", Device::cpu());
      try {
        (void)dispatch(*op, in, attrs);
        ++accepted;
        break;
      } catch (const Error& e) {
        last_error = e.what();
      }
    }
    INFO(op->name, ": ", last_error);
    CHECK(accepted > 0);
  }
}
