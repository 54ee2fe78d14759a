#pragma once
// Comparing a GPU output with the CPU reference: per-dtype tolerances (relative plus
// absolute), exact integers and bools, NaN/Inf agreement, and the first mismatches
// reported with their multi-dimensional indices.
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace consistency {

// |gpu - cpu| <= tol * (1 + |cpu|). Integers and bools: tol 0.
inline double tolerance(kiln::DType dt) {
  switch (dt) {
    case kiln::DType::f64:
      return 1e-12;
    case kiln::DType::f32:
      return 1e-5;
    case kiln::DType::f16:
      return 1e-3;
    case kiln::DType::bf16:
      return 1e-2;
    default:
      return 0.0;
  }
}

inline std::string index_str(std::int64_t flat, const kiln::Shape& shape) {
  std::vector<std::int64_t> idx(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] ? flat % shape[d] : 0;
    flat = shape[d] ? flat / shape[d] : 0;
  }
  std::string r = "[";
  for (std::size_t d = 0; d < idx.size(); ++d) r += (d ? "," : "") + std::to_string(idx[d]);
  return r + "]";
}

// Whether two floating values agree: same NaN-ness, equal infinities, else within tolerance.
inline bool close(double cpu, double gpu, double tol) {
  if (std::isnan(cpu) || std::isnan(gpu)) return std::isnan(cpu) && std::isnan(gpu);
  if (std::isinf(cpu) || std::isinf(gpu)) return cpu == gpu;
  return std::fabs(gpu - cpu) <= tol * (1.0 + std::fabs(cpu));
}

// Empty when `gpu_out` matches `cpu` (tolerance times `tol_scale`); else what differs, with up to `max_report`
// mismatches.
inline std::string compare_outputs(const kiln::Tensor& cpu, const kiln::Tensor& gpu_out, int max_report = 8,
                                   double tol_scale = 1.0) {
  std::ostringstream os;
  if (!gpu_out.defined() || !cpu.defined()) return cpu.defined() == gpu_out.defined() ? "" : "one output is undefined";
  if (cpu.dtype() != gpu_out.dtype())
    return "dtype: cpu " + std::string(kiln::dtype_name(cpu.dtype())) + ", gpu " +
           std::string(kiln::dtype_name(gpu_out.dtype()));
  if (cpu.shape() != gpu_out.shape())
    return "shape: cpu " + kiln::shape_str(cpu.shape()) + ", gpu " + kiln::shape_str(gpu_out.shape());
  const kiln::Tensor gpu = gpu_out.to(kiln::Device::cpu());
  std::int64_t bad = 0;
  if (kiln::is_floating(cpu.dtype())) {
    const double tol = tolerance(cpu.dtype()) * tol_scale;
    const std::vector<double> a = cpu.to_vector<double>(), b = gpu.to_vector<double>();
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (close(a[i], b[i], tol)) continue;
      if (bad++ < max_report)
        os << "\n    at " << index_str(static_cast<std::int64_t>(i), cpu.shape()) << ": cpu " << a[i] << ", gpu "
           << b[i] << " (|diff| " << std::fabs(a[i] - b[i]) << ", allowed " << tol * (1 + std::fabs(a[i])) << ")";
    }
  } else {
    const std::vector<std::int64_t> a = cpu.to_vector<std::int64_t>(), b = gpu.to_vector<std::int64_t>();
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (a[i] == b[i]) continue;
      if (bad++ < max_report)
        os << "\n    at " << index_str(static_cast<std::int64_t>(i), cpu.shape()) << ": cpu " << a[i] << ", gpu "
           << b[i];
    }
  }
  if (bad == 0) return "";
  return std::to_string(bad) + " of " + std::to_string(cpu.numel()) + " elements differ" + os.str();
}

}  // namespace consistency
