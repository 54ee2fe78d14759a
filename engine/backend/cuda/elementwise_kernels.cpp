// Kernel specs of the elementwise templates. A pointwise op's spec is generated from its
// OpDef (register_op calls register_pointwise_kernel with the op's expression); fill and
// where, which have no expression, are registered here.
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/runtime/kernel_registry.h"
#include "launchers.h"

namespace kiln::kernels {

namespace {

using rt::Bindings;
using rt::KernelSpec;

// Bindings shared by the unary and binary templates for an (input, output) tuple.
Bindings pair_bindings(const DTypes& d, std::uint32_t variant, const std::string& expr) {
  return {{"PRELUDE", rt::device_prelude(d)},
          {"VARIANT", std::to_string(variant)},
          {"TIN", std::string(cuda_storage_type(d[0]))},
          {"TOUT", std::string(cuda_storage_type(d[1]))},
          {"COMPUTE", std::string(cuda_compute_type(d[0]))},
          {"OP", expr}};
}

Bindings value_bindings(const DTypes& d, std::uint32_t variant) {
  return {{"PRELUDE", rt::device_prelude(d)},
          {"VARIANT", std::to_string(variant)},
          {"T", std::string(cuda_storage_type(d[0]))}};
}

void register_value_op(const std::string& op, const char* tmpl, const char* entry) {
  KernelSpec s;
  s.op = op;
  s.template_name = tmpl;
  s.entry = entry;
  for (DType t : kAllDTypes) s.dtypes.push_back({t});
  s.variants = {0, 1};
  s.bind = value_bindings;
  rt::register_kernel(std::move(s));
}

const bool registered_value_ops = [] {
  register_value_op("fill", "fill", "kiln_fill");
  register_value_op("where", "where", "kiln_where");
  return true;
}();

}  // namespace

std::vector<DTypes> pointwise_tuples(PointwiseDomain domain) {
  std::vector<DTypes> out;
  for (DType t : kAllDTypes) {
    switch (domain) {
      case PointwiseDomain::numeric:
        if (t != DType::boolean) out.push_back({t, t});
        break;
      case PointwiseDomain::floating:
        if (is_floating(t)) out.push_back({t, t});
        break;
      case PointwiseDomain::any_to_bool:
        out.push_back({t, DType::boolean});
        break;
      case PointwiseDomain::floating_to_bool:
        if (is_floating(t)) out.push_back({t, DType::boolean});
        break;
      case PointwiseDomain::all_pairs:
        for (DType u : kAllDTypes) out.push_back({t, u});
        break;
    }
  }
  return out;
}

const KernelSpec& register_pointwise_kernel(const std::string& op, int arity, const std::string& expr,
                                            PointwiseDomain domain) {
  if (arity != 1 && arity != 2)
    throw ValueError("[kernels] pointwise op '" + op + "' must take 1 or 2 inputs, not " + std::to_string(arity));
  KernelSpec s;
  s.op = op;
  s.template_name = arity == 1 ? "elementwise_unary" : "elementwise_binary";
  s.entry = arity == 1 ? "kiln_unary" : "kiln_binary";
  s.dtypes = pointwise_tuples(domain);
  s.variants = arity == 1 ? std::vector<std::uint32_t>{0, 1} : std::vector<std::uint32_t>{0, 1, 2};
  s.bind = [expr](const DTypes& d, std::uint32_t v) { return pair_bindings(d, v, expr); };
  return rt::register_kernel(std::move(s));
}

const rt::KernelSpec& kernel(std::string_view op) {
  if (const rt::KernelSpec* k = rt::find_kernel(op)) return *k;
  throw ValueError("[kernels] no kernel is registered for op '" + std::string(op) + "'");
}

}  // namespace kiln::kernels
