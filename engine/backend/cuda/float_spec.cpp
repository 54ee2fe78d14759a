// The kernel spec shape shared by templates instantiated once per floating dtype.
#include <string>
#include <utility>

#include "launchers.h"

namespace kiln::kernels {

const rt::KernelSpec& register_float_spec(const char* op, const char* template_name, const char* entry,
                                          const char* compute_placeholder, bool both_half_headers) {
  rt::KernelSpec s;
  s.op = op;
  s.template_name = template_name;
  s.entry = entry;
  s.dtypes = {DTypes{DType::f32}, DTypes{DType::f64}, DTypes{DType::f16}, DTypes{DType::bf16}};
  s.bind = [compute_placeholder, both_half_headers](const DTypes& d, std::uint32_t) -> rt::Bindings {
    return {{"PRELUDE", rt::device_prelude(both_half_headers ? DTypes{d[0], DType::f16, DType::bf16} : d)},
            {"T", std::string(cuda_storage_type(d[0]))},
            {compute_placeholder, d[0] == DType::f64 ? "double" : "float"}};
  };
  return rt::register_kernel(std::move(s));
}

}  // namespace kiln::kernels
