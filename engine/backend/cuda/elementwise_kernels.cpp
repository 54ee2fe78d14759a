// The elementwise templates: their specs (a pointwise op's is generated from its OpDef, as
// register_op calls register_pointwise_kernel with the op's expression; fill and where, which
// have no expression, are registered here) and their launchers, which pick the variant from the
// collapsed layout and pass arguments in the kernels' parameter order.
#include <algorithm>
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/runtime/kernel_registry.h"
#include "elementwise_kernels.h"
#include "kiln/runtime/module_cache.h"
#include "layout.h"

namespace kiln::kernels {

namespace {

using rt::Bindings;
using rt::KernelSpec;

// Bindings shared by the unary and binary templates for an (input, output) tuple.
Bindings pair_bindings(const DTypes& d, std::uint32_t variant, const std::string& expr) {
  return {{"PRELUDE", rt::device_prelude(d)},
          {"VARIANT", std::to_string(variant)},
          {"TIN", std::string(cuda_storage_type(d[0]))},
          {"TOUT", std::string(cuda_storage_type(d[1]))},
          {"COMPUTE", std::string(cuda_compute_type(d[0]))},
          {"OP", expr}};
}

Bindings value_bindings(const DTypes& d, std::uint32_t variant) {
  return {{"PRELUDE", rt::device_prelude(d)},
          {"VARIANT", std::to_string(variant)},
          {"T", std::string(cuda_storage_type(d[0]))}};
}

void register_value_op(const std::string& op, const char* tmpl, const char* entry) {
  KernelSpec s;
  s.op = op;
  s.template_name = tmpl;
  s.entry = entry;
  for (DType t : kAllDTypes) s.dtypes.push_back({t});
  s.variants = {0, 1};
  s.bind = value_bindings;
  rt::register_kernel(std::move(s));
}

const bool registered_value_ops = [] {
  register_value_op("fill", "fill", "kiln_fill");
  register_value_op("where", "where", "kiln_where");
  return true;
}();

}  // namespace

std::vector<DTypes> pointwise_tuples(PointwiseDomain domain) {
  std::vector<DTypes> out;
  for (DType t : kAllDTypes) {
    switch (domain) {
      case PointwiseDomain::numeric:
        if (t != DType::boolean) out.push_back({t, t});
        break;
      case PointwiseDomain::floating:
        if (is_floating(t)) out.push_back({t, t});
        break;
      case PointwiseDomain::any_to_bool:
        out.push_back({t, DType::boolean});
        break;
      case PointwiseDomain::floating_to_bool:
        if (is_floating(t)) out.push_back({t, DType::boolean});
        break;
      case PointwiseDomain::all_pairs:
        for (DType u : kAllDTypes) out.push_back({t, u});
        break;
    }
  }
  return out;
}

const KernelSpec& register_pointwise_kernel(const std::string& op, int arity, const std::string& expr,
                                            PointwiseDomain domain) {
  if (arity != 1 && arity != 2)
    throw ValueError("[kernels] pointwise op '" + op + "' must take 1 or 2 inputs, not " + std::to_string(arity));
  KernelSpec s;
  s.op = op;
  s.template_name = arity == 1 ? "elementwise_unary" : "elementwise_binary";
  s.entry = arity == 1 ? "kiln_unary" : "kiln_binary";
  s.dtypes = pointwise_tuples(domain);
  s.variants = arity == 1 ? std::vector<std::uint32_t>{0, 1} : std::vector<std::uint32_t>{0, 1, 2};
  s.bind = [expr](const DTypes& d, std::uint32_t v) { return pair_bindings(d, v, expr); };
  return rt::register_kernel(std::move(s));
}


namespace {


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
