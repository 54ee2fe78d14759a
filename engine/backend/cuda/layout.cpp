#include "layout.h"

#include <string>

#include "kiln/error.h"

namespace kiln::kernels {

static_assert(sizeof(Layout<1>) == 16 + 8 * kMaxDims * 3, "Layout must match the device struct");

// As PyTorch's IntDivider: shift = ceil(log2 d), magic = 2^32 (2^shift - d) / d + 1.
void fast_divider(std::int64_t d, std::uint32_t& magic, std::uint32_t& shift) {
  std::uint32_t s = 0;
  while (s < 31 && (std::int64_t{1} << s) < d) ++s;
  shift = s;
  magic = static_cast<std::uint32_t>(((std::uint64_t{1} << 32) * ((std::uint64_t{1} << s) - static_cast<std::uint64_t>(d))) /
                                         static_cast<std::uint64_t>(d) +
                                     1);
}

void collapse_dims(std::string_view op, std::span<const std::int64_t> shape, std::span<const Operand* const> operands,
                   std::int64_t& n, std::int32_t& ndim, std::int64_t* size, std::int64_t* stride) {
  const std::size_t nop = operands.size();
  if (nop > static_cast<std::size_t>(kMaxDims)) throw ValueError("[" + std::string(op) + "] too many kernel operands");
  if (shape.size() > static_cast<std::size_t>(kMaxDims)) {
    throw ShapeError("[" + std::string(op) + "] GPU kernels take at most " + std::to_string(kMaxDims) +
                     " dims; got " + std::to_string(shape.size()));
  }
  n = 1;
  for (std::int64_t s : shape) {
    if (s < 0) throw ShapeError("[" + std::string(op) + "] negative size " + std::to_string(s) + " in a shape");
    n *= s;
  }
  ndim = 0;
  if (n == 0) return;

  // Outermost first while merging: dim d joins the previous one when, for every operand,
  // stepping the previous dim once equals stepping d over its whole extent.
  std::int64_t sz[kMaxDims];
  std::int64_t st[kMaxDims][kMaxDims];  // [operand][dim]
  int nd = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = nd > 0;
    for (std::size_t k = 0; k < nop && merge; ++k) merge = st[k][nd - 1] == operands[k]->strides[d] * shape[d];
    if (merge) {
      sz[nd - 1] *= shape[d];
      for (std::size_t k = 0; k < nop; ++k) st[k][nd - 1] = operands[k]->strides[d];
    } else {
      sz[nd] = shape[d];
      for (std::size_t k = 0; k < nop; ++k) st[k][nd] = operands[k]->strides[d];
      ++nd;
    }
  }

  bool contiguous = nd == 0;
  if (nd == 1) {
    contiguous = true;
    for (std::size_t k = 0; k < nop; ++k) contiguous = contiguous && st[k][0] == 1;
  }
  if (contiguous) return;
  ndim = nd;
  for (int j = 0; j < nd; ++j) {
    size[j] = sz[nd - 1 - j];
    for (std::size_t k = 0; k < nop; ++k) stride[k * kMaxDims + j] = st[k][nd - 1 - j];
  }
}

}  // namespace kiln::kernels
