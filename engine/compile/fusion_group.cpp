// A pending group's wiring and its description for the fused kernel family
// (backend/cuda/generated/fused): each op's expression, dtypes, params and inputs.
#include "fusion_group.h"

#include <algorithm>

namespace kiln::compile_detail {

int producer(const std::vector<Pending>& ops, const Tensor& t) {
  for (std::size_t k = 0; k < ops.size(); ++k)
    if (ops[k].output.impl() == t.impl()) return static_cast<int>(k);
  return -1;
}

std::vector<Tensor> outside_inputs(const std::vector<Pending>& ops) {
  std::vector<Tensor> ext;
  for (const Pending& p : ops)
    for (const Tensor& in : p.inputs)
      if (producer(ops, in) < 0 &&
          std::none_of(ext.begin(), ext.end(), [&](const Tensor& e) { return e.impl() == in.impl(); }))
        ext.push_back(in);
  return ext;
}

std::pair<char, int> source_of(const std::vector<Pending>& ops, const std::vector<Tensor>& ext, const Tensor& in) {
  const int k = producer(ops, in);
  if (k >= 0) return {'t', k};
  const auto it = std::find_if(ext.begin(), ext.end(), [&](const Tensor& e) { return e.impl() == in.impl(); });
  return {'v', static_cast<int>(it - ext.begin())};
}

kernels::FusedGroup describe(const std::vector<Pending>& ops, const std::vector<Tensor>& ext,
                             const std::vector<int>& stored) {
  kernels::FusedGroup g;
  for (const Pending& p : ops) {
    kernels::FusedOp op{p.op->name, p.expr->expr, p.inputs[0].dtype(), p.output.dtype(), p.params, {},
                        p.scalar,   p.scalar_first};
    for (const Tensor& in : p.inputs) {
      const auto [kind, index] = source_of(ops, ext, in);
      op.inputs.push_back({kind == 't', index});
    }
    g.ops.push_back(std::move(op));
  }
  for (const Tensor& e : ext) g.outside.push_back(e.dtype());
  g.stored = stored;
  return g;
}

}  // namespace kiln::compile_detail
