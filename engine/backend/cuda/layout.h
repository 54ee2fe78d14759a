#pragma once
// Operand layouts as the kernels take them by value (kiln::Layout in
// kernel_templates/prelude.cu): dims innermost first, element strides per
// operand with operand 0 the output, and ndim == 0 when every operand is contiguous.
#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#include "launch_common.h"

namespace kiln::kernels {

template <int NOP>
struct Layout {
  std::int64_t n = 0;
  std::int32_t ndim = 0;
  std::int32_t padding = 0;  // the device struct's alignment gap, spelled out
  std::int64_t size[kMaxDims] = {};
  std::uint32_t magic[kMaxDims] = {};  // division by size[d] as a multiply, for n < 2^31
  std::uint32_t shift[kMaxDims] = {};
  std::int64_t stride[NOP][kMaxDims] = {};
};

// Drops size-1 dims and merges neighbouring dims that are jointly contiguous in every
// operand, writing innermost first into size/stride (stride is operands.size() rows of
// kMaxDims). ndim = 0 when the result is contiguous for every operand. ShapeError
// (naming `op`) for more than kMaxDims dims or a negative size.
void collapse_dims(std::string_view op, std::span<const std::int64_t> shape, std::span<const Operand* const> operands,
                   std::int64_t& n, std::int32_t& ndim, std::int64_t* size, std::int64_t* stride);

// Magic number and shift with r / d == (umulhi(r, magic) + r) >> shift for r < 2^31.
void fast_divider(std::int64_t d, std::uint32_t& magic, std::uint32_t& shift);

template <int NOP>
Layout<NOP> make_layout(std::string_view op, std::span<const std::int64_t> shape,
                        const std::array<const Operand*, NOP>& operands) {
  Layout<NOP> L;
  collapse_dims(op, shape, operands, L.n, L.ndim, L.size, &L.stride[0][0]);
  if (L.n < (std::int64_t{1} << 31))
    for (int d = 0; d < L.ndim; ++d) fast_divider(L.size[d], L.magic[d], L.shift[d]);
  return L;
}

}  // namespace kiln::kernels
