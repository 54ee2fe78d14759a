#pragma once
// Cases of the PyTorch differential test, generated from one OpDef: its dtypes (and the
// input dtypes its dtype rule promotes), small shapes with broadcasting and strided views
// (layouts from tests/support/consistency_cases.h), mixed-dtype pairs, and edge values.
#include <string>
#include <vector>

#include "consistency_cases.h"

namespace difftest {

using consistency::InputSpec;
using consistency::Layout;
using kiln::Attrs;
using kiln::DType;
using kiln::Shape;
using kiln::Tensor;

// random: seeded values in the op's range; edge_grid: every edge value of input 0 meets
// every edge value of input 1 ([E0, E1] grid); edge_sparse: random with every third element
// an edge value, so reductions see rows with and without NaN.
enum class Values { random, edge_grid, edge_sparse };
const char* values_name(Values v);

struct Case {
  std::string name;          // add(dtype=f16, shape=[5,7], values=edge_grid)
  DType dtype = DType::f32;  // of every input whose InputSpec names no dtype
  std::vector<InputSpec> inputs;
  Attrs attrs;
  Values values = Values::random;
};

std::vector<Case> make_cases(const kiln::OpDef& op);

// Edge values of a dtype: +-0, subnormals, +-inf, NaN and values near overflow for floats;
// the extremes and their neighbours for integers. Exact in the dtype's storage.
std::vector<double> float_edges(DType dt);
std::vector<std::int64_t> int_edges(DType dt);

// One input on the CPU: its base storage (what is saved) and the view the op reads.
struct Input {
  Tensor base;
  consistency::ViewPlan plan;
  bool is_view = false;
  bool edge = false;  // holds edge values
};
std::vector<Input> make_inputs(const kiln::OpDef& op, const Case& c, kiln::Generator& gen);

}  // namespace difftest
