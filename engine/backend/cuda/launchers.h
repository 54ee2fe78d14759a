#pragma once
// Host-side launch helpers for the generated kernels (engine-internal). Shapes are
// the output's; each operand gives element strides over that shape (0 where it
// broadcasts). Launches are asynchronous on the stream; zero elements launch nothing.
// Reduction launchers live beside these in reduce_launchers.h.
#include <array>
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
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
// template that also writes f16/bf16 values beside T's, as the optimizers do).
const rt::KernelSpec& register_float_spec(const char* op, const char* template_name, const char* entry,
                                          const char* compute_placeholder, bool both_half_headers = false);

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

// ---- Elementwise (elementwise_unary.cu, elementwise_binary.cu, fill.cu, where.cu) ----
// Dtype tuples: (in, out) for unary, binary and cast; (t) for fill and where.

// Which (input, output) tuples a pointwise op's kernel is instantiated for.
enum class PointwiseDomain {
  numeric,           // (t, t), t in f32 f64 f16 bf16 i32 i64 u8
  floating,          // (t, t), t in f32 f64 f16 bf16
  any_to_bool,       // (t, bool), every dtype
  floating_to_bool,  // (t, bool), t floating
  all_pairs,         // (t, u), every pair of dtypes (cast)
};
std::vector<DTypes> pointwise_tuples(PointwiseDomain domain);

// Registers the spec `op` of the unary (arity 1) or binary (arity 2) elementwise template
// with `expr` bound to ${OP}; register_op calls this for every OpDef with a pointwise expr.
// Variants: 0 contiguous, 1 strided, and for binary ops 2 with a host scalar.
const rt::KernelSpec& register_pointwise_kernel(const std::string& op, int arity, const std::string& expr,
                                                PointwiseDomain domain);

// y = op(x; p0, p1) (p0/p1: leaky_relu slope, clamp bounds; ignored by other ops).
void launch_unary(const rt::KernelSpec& spec, DType in, DType out, const Operand& x, const Operand& y,
                  std::span<const std::int64_t> shape, double p0, double p1, const rt::Stream& s);
// y = op(a, b; p0, p1); a and b share the input dtype (p0/p1: user pointwise params).
void launch_binary(const rt::KernelSpec& spec, DType in, DType out, const Operand& a, const Operand& b,
                   const Operand& y, std::span<const std::int64_t> shape, const rt::Stream& s, double p0 = 0,
                   double p1 = 0);
// y = op(scalar, a) when scalar_first, else op(a, scalar). The scalar converts to the
// input's compute type (float for f16/bf16).
void launch_binary_scalar(const rt::KernelSpec& spec, DType in, DType out, const Operand& a, Scalar scalar,
                          bool scalar_first, const Operand& y, std::span<const std::int64_t> shape,
                          const rt::Stream& s);
// y = x converted to `out`; with in == out this is the strided copy (contiguous(), views).
void launch_cast(DType in, DType out, const Operand& x, const Operand& y, std::span<const std::int64_t> shape,
                 const rt::Stream& s);
void launch_fill(DType t, const Operand& y, std::span<const std::int64_t> shape, Scalar value,
                 const rt::Stream& s);
// y = cond ? a : b; cond is bool, a, b and y are `t`.
void launch_where(DType t, const Operand& cond, const Operand& a, const Operand& b, const Operand& y,
                  std::span<const std::int64_t> shape, const rt::Stream& s);

}  // namespace kiln::kernels
