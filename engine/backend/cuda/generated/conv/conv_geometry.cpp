#include "conv_geometry.h"

namespace kiln::kernels {

const char* pass_name(ConvPass p) {
  return p == ConvPass::forward ? "fwd" : p == ConvPass::grad_input ? "dgrad" : "wgrad";
}

void ConvGeometry::add_to(rt::GeneratedKey& key) const {
  key.add(n, c, h, w, o, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, groups);
}

std::string ConvGeometry::text() const {
  std::string t;
  for (std::int64_t v : {n, c, h, w, o, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, groups})
    t.append(t.empty() ? "" : " ").append(std::to_string(v));
  return t;
}

const char* math_name(ConvMath m) {
  static const char* names[] = {"bf16", "f16", "tf32", "f32"};
  return names[static_cast<int>(m)];
}

std::optional<ConvMath> conv_math(DType a, DType b, DType out, bool tf32) {
  if (a != b || a != out) return std::nullopt;
  if (a == DType::bf16) return ConvMath::bf16;
  if (a == DType::f16) return ConvMath::f16;
  if (a == DType::f32) return tf32 ? ConvMath::tf32 : ConvMath::f32;
  return std::nullopt;
}

}  // namespace kiln::kernels
