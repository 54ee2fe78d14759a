#pragma once
// The fused pointwise family: a group of pointwise ops of one shape as one generated kernel,
// each op's device expression (its OpDef's) a function of its own dtypes, called in order. The
// group's values keep their dtypes, so the kernel rounds where the single ops round and gives
// their bits. engine/compile describes a pending group as a FusedGroup; this builds, keys and
// launches its kernel.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/cuda/launch_common.h"
#include "kiln/runtime/module_cache.h"

namespace kiln::kernels {

// Where an op's input comes from: the result of an earlier op of the group, or an outside input.
struct FusedInput {
  bool from_op = false;
  int index = 0;  // the op's, or the outside input's (by first use)
};

struct FusedOp {
  std::string_view name;  // the op's, for the module's label (the registry keeps both)
  std::string_view expr;  // its device expression over x, or a and b
  DType in = DType::f32, out = DType::f32;  // its inputs' dtype and its output's
  std::pair<double, double> params{};       // p0, p1
  std::vector<FusedInput> inputs;           // one or two
  std::optional<Scalar> scalar{};           // a tensor-scalar op's operand, as b (a when scalar_first)
  bool scalar_first = false;
};

struct FusedGroup {
  std::vector<FusedOp> ops;
  std::vector<DType> outside;  // the outside inputs' dtypes, in order of first use
  std::vector<int> stored;     // the ops whose results are written, in order
  int operands() const { return static_cast<int>(stored.size() + outside.size()); }
};

// Stored outputs plus outside inputs one kernel takes.
inline constexpr int kMaxFusedOperands = 8;

// The group's kernel source (entry kiln_fused); lets tests compile groups without a GPU.
std::string fused_source(const FusedGroup& g);
// The group's kernel on `device`, keyed by everything its source depends on: a group met again
// builds no source, and another process finds the module in the disk cache by the same name.
rt::Function fused_function(const FusedGroup& g, int device);
// Runs it over `shape` on `s`. operands: the stored outputs, then the outside inputs, each with
// its element strides over `shape`. ValueError for more than kMaxFusedOperands.
void launch_fused(const FusedGroup& g, std::span<const std::int64_t> shape, std::span<const Operand> operands,
                  const rt::Stream& s);

}  // namespace kiln::kernels
