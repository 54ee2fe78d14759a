// Kernel specs of the index ops over kernel_templates/index.cu: gather (every dtype, a
// copy), scatter_add (numeric dtypes; f16/bf16 accumulate in f32) and one_hot (i64 out).
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/runtime/kernel_registry.h"
#include "launch_common.h"

namespace kiln::kernels {

namespace {

using rt::Bindings;
using rt::KernelSpec;

// The scatter accumulator: atomics exist for float, double, int and 64-bit integers.
std::string accumulator(DType t) {
  if (t == DType::f16 || t == DType::bf16) return "float";
  return std::string(cuda_storage_type(t));
}

void register_index_kernel(const char* op, const char* entry, int kind, std::vector<DType> dtypes) {
  KernelSpec s;
  s.op = op;
  s.template_name = "index";
  s.entry = entry;
  for (DType t : dtypes) s.dtypes.push_back({t});
  s.bind = [kind](const DTypes& d, std::uint32_t) -> Bindings {
    return {{"PRELUDE", rt::device_prelude(d)},
            {"T", std::string(cuda_storage_type(d[0]))},
            {"ACC", accumulator(d[0])},
            {"KIND", std::to_string(kind)}};
  };
  rt::register_kernel(std::move(s));
}

const bool registered_index_ops = [] {
  register_index_kernel("gather", "kiln_gather", 0, {kAllDTypes.begin(), kAllDTypes.end()});
  register_index_kernel("scatter_add", "kiln_scatter_add", 1,
                        {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64});
  register_index_kernel("one_hot", "kiln_one_hot", 2, {DType::i64});
  return true;
}();

}  // namespace

}  // namespace kiln::kernels
