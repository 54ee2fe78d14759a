// Host side of the elementwise templates: pick the variant from the collapsed layout,
// fetch the cached function and launch with arguments in the kernels' parameter order.
#include <algorithm>
#include <string>

#include "kiln/error.h"
#include "kiln/runtime/module_cache.h"
#include "launchers.h"
#include "layout.h"

namespace kiln::kernels {

namespace {

// Grid-stride grids of a few waves: enough blocks to fill every SM, few enough that
// each thread loops (blocks of 256 at 2048 threads per SM is 8 per SM per wave).
constexpr unsigned kBlocksPerSm = 32;

// The contiguous kernels' launch: 16-byte vectors of the widest operand, kVectorsPerThread
// of them per thread (prelude.cu), and enough blocks to cover them all in one pass.
constexpr std::uint64_t kContiguousVectorsPerThread = 2;
constexpr unsigned kContiguousBlock = 256;

rt::LaunchConfig contiguous_config(std::int64_t n, std::initializer_list<DType> dtypes) {
  std::size_t widest = 1;
  for (DType t : dtypes) widest = std::max(widest, dtype_size(t));
  const auto per = static_cast<std::uint64_t>(16 / widest);
  const std::uint64_t vectors = (static_cast<std::uint64_t>(n) + per - 1) / per;
  const std::uint64_t span = kContiguousBlock * kContiguousVectorsPerThread;
  const std::uint64_t blocks = std::min<std::uint64_t>((vectors + span - 1) / span, 0x7fffffffu);
  return rt::linear_config(vectors, kContiguousBlock, static_cast<unsigned>(blocks));
}

rt::Function function(const rt::KernelSpec& spec, const DTypes& d, Variant v, const rt::Stream& s) {
  return rt::get_function(spec, d, static_cast<std::uint32_t>(v), s.device());
}

}  // namespace

Scalar::Scalar(double v) : f(v) {
  // -2^63 <= v < 2^63 keeps the conversion defined.
  i = (v >= -9223372036854775808.0 && v < 9223372036854775808.0) ? static_cast<std::int64_t>(v) : 0;
}

RowLaunch row_launch(std::int64_t rows, std::int64_t cols, int device) {
  RowLaunch l;
  l.width = cols <= 1024 ? 32 : static_cast<std::int32_t>(kRowBlock);
  const std::int64_t sms = std::max(1, rt::device_info(device).sm_count);
  l.config.grid.x = static_cast<unsigned>(std::clamp<std::int64_t>(ceil_div(rows, kRowBlock / l.width), 1, 32 * sms));
  l.config.block.x = kRowBlock;
  return l;
}

rt::LaunchConfig grid_stride_config(std::uint64_t items, int device) {
  const unsigned sms = static_cast<unsigned>(std::max(1, rt::device_info(device).sm_count));
  return rt::linear_config(items, 256, sms * kBlocksPerSm);
}

void launch_unary(const rt::KernelSpec& spec, DType in, DType out, const Operand& x, const Operand& y,
                  std::span<const std::int64_t> shape, double p0, double p1, const rt::Stream& s) {
  const auto L = make_layout<2>(spec.op, shape, {&y, &x});
  if (L.n == 0) return;
  const DTypes d{in, out};
  if (L.ndim == 0) {
    const long long n = L.n;
    rt::launch(function(spec, d, Variant::contiguous, s), contiguous_config(n, {in, out}),
               s, x.ptr, y.ptr, n, p0, p1);
  } else {
    rt::launch(function(spec, d, Variant::strided, s), grid_stride_config(L.n, s.device()), s, x.ptr, y.ptr, L, p0,
               p1);
  }
}

void launch_binary(const rt::KernelSpec& spec, DType in, DType out, const Operand& a, const Operand& b,
                   const Operand& y, std::span<const std::int64_t> shape, const rt::Stream& s, double p0,
                   double p1) {
  const auto L = make_layout<3>(spec.op, shape, {&y, &a, &b});
  if (L.n == 0) return;
  const DTypes d{in, out};
  if (L.ndim == 0) {
    const long long n = L.n;
    rt::launch(function(spec, d, Variant::contiguous, s), contiguous_config(n, {in, out}),
               s, a.ptr, b.ptr, y.ptr, n, p0, p1);
  } else {
    rt::launch(function(spec, d, Variant::strided, s), grid_stride_config(L.n, s.device()), s, a.ptr, b.ptr, y.ptr,
               L, p0, p1);
  }
}

void launch_binary_scalar(const rt::KernelSpec& spec, DType in, DType out, const Operand& a, Scalar scalar,
                          bool scalar_first, const Operand& y, std::span<const std::int64_t> shape,
                          const rt::Stream& s) {
  const auto L = make_layout<2>(spec.op, shape, {&y, &a});
  if (L.n == 0) return;
  const rt::LaunchConfig cfg =
      L.ndim == 0 ? contiguous_config(L.n, {in, out}) : grid_stride_config(static_cast<std::uint64_t>(L.n), s.device());
  const long long si = scalar.i;
  const int first = scalar_first ? 1 : 0;
  const double p0 = 0, p1 = 0;  // the scalar ops (add_scalar...) have no params
  rt::launch(function(spec, {in, out}, Variant::scalar, s), cfg, s, a.ptr, y.ptr,
             L, scalar.f, si, first, p0, p1);
}

void launch_cast(DType in, DType out, const Operand& x, const Operand& y, std::span<const std::int64_t> shape,
                 const rt::Stream& s) {
  static const rt::KernelSpec& spec = kernel("cast");
  launch_unary(spec, in, out, x, y, shape, 0.0, 0.0, s);
}

void launch_fill(DType t, const Operand& y, std::span<const std::int64_t> shape, Scalar value,
                 const rt::Stream& s) {
  static const rt::KernelSpec& spec = kernel("fill");
  const auto L = make_layout<1>(spec.op, shape, {&y});
  if (L.n == 0) return;
  const long long vi = value.i;
  if (L.ndim == 0) {
    const long long n = L.n;
    rt::launch(function(spec, {t}, Variant::contiguous, s), contiguous_config(n, {t}), s,
               y.ptr, n, value.f, vi);
  } else {
    rt::launch(function(spec, {t}, Variant::strided, s), grid_stride_config(L.n, s.device()), s, y.ptr, L, value.f,
               vi);
  }
}

void launch_where(DType t, const Operand& cond, const Operand& a, const Operand& b, const Operand& y,
                  std::span<const std::int64_t> shape, const rt::Stream& s) {
  static const rt::KernelSpec& spec = kernel("where");
  const auto L = make_layout<4>(spec.op, shape, {&y, &cond, &a, &b});
  if (L.n == 0) return;
  if (L.ndim == 0) {
    const long long n = L.n;
    rt::launch(function(spec, {t}, Variant::contiguous, s),
               contiguous_config(n, {t, DType::boolean}), s, cond.ptr, a.ptr, b.ptr, y.ptr,
               n);
  } else {
    rt::launch(function(spec, {t}, Variant::strided, s), grid_stride_config(L.n, s.device()), s, cond.ptr, a.ptr,
               b.ptr, y.ptr, L);
  }
}

}  // namespace kiln::kernels
