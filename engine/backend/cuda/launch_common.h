#pragma once
// What the launchers of every kernel family share (engine-internal): operands, host scalars,
// spec lookup, the floating-dtype spec shape and launch geometries. Each family declares its
// launchers in its own <family>_kernels.h. Shapes are the output's; each operand gives element
// strides over that shape (0 where it broadcasts). Launches are asynchronous on the stream;
// zero elements launch nothing.
#include <array>
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/memory.h"

namespace kiln::kernels {

inline constexpr int kMaxDims = 8;

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

struct Operand {
  rt::DevicePtr ptr = 0;
  std::array<std::int64_t, kMaxDims> strides{};  // elements, indexed like the shape's dims
};

// A host scalar for a kernel: the double, and an exact integer for integer dtypes.
struct Scalar {
  double f = 0;
  std::int64_t i = 0;
  Scalar(double v);  // i = v truncated toward zero (0 when out of the i64 range or NaN)
  template <std::integral I>
  Scalar(I v) : f(static_cast<double>(v)), i(static_cast<std::int64_t>(v)) {}
};

// Kernel variants (part of the cache key).
enum class Variant : std::uint32_t { contiguous = 0, strided = 1, scalar = 2 };

// The registered spec for `op`; throws ValueError when there is none.
const rt::KernelSpec& kernel(std::string_view op);

// Registers a spec with one tuple (t) per floating dtype, binding PRELUDE, T
// (the storage type) and `compute_placeholder` (double for f64, else float).
// `both_half_headers`: the prelude includes cuda_fp16.h and cuda_bf16.h for every t (a
// template that also writes f16/bf16 values beside T's, as the optimizers do). `pasted`: further
// placeholders, each bound to the source of the template named beside it.
const rt::KernelSpec& register_float_spec(const char* op, const char* template_name, const char* entry,
                                          const char* compute_placeholder, bool both_half_headers = false,
                                          std::vector<std::pair<const char*, const char*>> pasted = {});

// Grid-stride launch config over `items` work items (blocks of 256), capped at a few
// waves of the device's SMs.
rt::LaunchConfig grid_stride_config(std::uint64_t items, int device);

// Row kernels of kRowBlock threads (softmax.cu, norm.cu): a warp per row while a row is at most
// 1024 elements (32 loads per lane), else a block per row; at least one block, at most 32 per SM.
inline constexpr unsigned kRowBlock = 256;
struct RowLaunch {
  rt::LaunchConfig config;
  std::int32_t width = 32;  // lanes per row
};
RowLaunch row_launch(std::int64_t rows, std::int64_t cols, int device);

}  // namespace kiln::kernels
