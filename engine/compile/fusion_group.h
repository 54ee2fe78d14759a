#pragma once
// Internal to fusion: a pending group of pointwise ops, and the generated kernel made of it.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/generated/fused/fused_kernels.h"
#include "core/registry.h"

namespace kiln::compile_detail {

// One held-back op. Each value keeps its own dtype: an op loads its inputs in their storage
// type, computes in its input's compute type and rounds to its output dtype, as its single
// kernel does, so a mixed-dtype group (autocast's casts included) gives the same bits.
struct Pending {
  const OpDef* op;
  const PointwiseExpr* expr;  // the op's, or for a tensor-scalar op its binary op's
  std::pair<double, double> params;
  std::vector<Tensor> inputs;
  Tensor output;
  Attrs attrs;  // for the op's own kernel, when it ends up alone
  std::optional<kernels::Scalar> scalar{};  // a tensor-scalar op's operand
  bool scalar_first = false;
};

// Index of the pending op that makes t, or -1.
int producer(const std::vector<Pending>& ops, const Tensor& t);
// Inputs that no pending op makes, each once, in order of first use.
std::vector<Tensor> outside_inputs(const std::vector<Pending>& ops);
// Where input `in` of an op comes from: 't' + the producing op, or 'v' + its outside index.
std::pair<char, int> source_of(const std::vector<Pending>& ops, const std::vector<Tensor>& ext, const Tensor& in);

// The group as the fused kernel family takes it: ext its outside inputs (outside_inputs),
// stored the ops whose results are written.
kernels::FusedGroup describe(const std::vector<Pending>& ops, const std::vector<Tensor>& ext,
                             const std::vector<int>& stored);

}  // namespace kiln::compile_detail
