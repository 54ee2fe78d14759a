// Kernel spec of erf (the gelu derivative needs it as an op): the unary elementwise
// template with the prelude's kiln::m::erf, floating dtypes only.
#include <string>

#include "kiln/dtype.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/templates.h"
#include "launchers.h"

namespace kiln::kernels {

namespace {

const bool registered = [] {
  rt::KernelSpec s;
  s.op = "erf";
  s.template_name = "elementwise_unary";
  s.entry = "kiln_unary";
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16}) s.dtypes.push_back({t, t});
  s.variants = {0, 1};
  s.bind = [](const DTypes& d, std::uint32_t variant) -> rt::Bindings {
    return {{"PRELUDE", rt::template_source("elementwise_common")},
            {"VARIANT", std::to_string(variant)},
            {"TIN", std::string(cuda_storage_type(d[0]))},
            {"TOUT", std::string(cuda_storage_type(d[1]))},
            {"COMPUTE", std::string(cuda_compute_type(d[0]))},
            {"OP", "kiln::m::erf(x)"}};
  };
  rt::register_kernel(std::move(s));
  return true;
}();

}  // namespace

}  // namespace kiln::kernels
