// ${PRELUDE} for every kernel: the runtime binds the one device prelude, so templates, per-shape
// kernels and fused kernels all get the same helpers.
#include <string>

#include "kiln/dtype.h"
#include "kiln/runtime/templates.h"

namespace kiln::rt {

std::string device_prelude(const DTypes& d) {
  bool f16 = false, bf16 = false;
  for (int i = 0; i < d.size(); ++i) {
    f16 = f16 || d[i] == DType::f16;
    bf16 = bf16 || d[i] == DType::bf16;
  }
  // Only the headers the tuple needs: they dominate NVRTC's compile time.
  std::string s;
  if (f16) s += "#include <cuda_fp16.h>\n";
  if (bf16) s += "#include <cuda_bf16.h>\n";
  return s + template_source("prelude");
}

}  // namespace kiln::rt
