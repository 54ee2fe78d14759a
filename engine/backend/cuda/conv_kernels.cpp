// Kernel specs of conv2d (kernel_templates/im2col.cu) and pooling (kernel_templates/pool.cu):
// one spec per entry point, each instantiated for the floating dtypes only.
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/runtime/kernel_registry.h"
#include "launch_common.h"

namespace kiln::kernels {

namespace {

void register_conv_entry(const char* op, const char* tmpl, const char* entry, int kind) {
  rt::KernelSpec s;
  s.op = op;
  s.template_name = tmpl;
  s.entry = entry;
  s.dtypes = {DTypes{DType::f32}, DTypes{DType::f64}, DTypes{DType::f16}, DTypes{DType::bf16}};
  s.bind = [kind](const DTypes& d, std::uint32_t) -> rt::Bindings {
    return {{"PRELUDE", rt::device_prelude(d)},
            {"T", std::string(cuda_storage_type(d[0]))},
            {"ACC", d[0] == DType::f64 ? "double" : "float"},
            {"KIND", std::to_string(kind)}};
  };
  rt::register_kernel(std::move(s));
}

const bool registered = [] {
  register_conv_entry("im2col", "im2col", "kiln_im2col", 0);
  register_conv_entry("col2im", "im2col", "kiln_col2im", 1);
  register_conv_entry("max_pool2d", "pool", "kiln_max_pool2d", 0);
  register_conv_entry("avg_pool2d", "pool", "kiln_avg_pool2d", 1);
  register_conv_entry("max_pool2d_backward", "pool", "kiln_max_pool2d_backward", 2);
  register_conv_entry("avg_pool2d_backward", "pool", "kiln_avg_pool2d_backward", 3);
  return true;
}();

}  // namespace

}  // namespace kiln::kernels
