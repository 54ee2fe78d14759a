#pragma once
// Internal to engine/optim: argument checks shared by the optimizers, the dtype their
// state is kept in; the fused GPU updates are backend/cuda/generated/optim.
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "backend/cuda/generated/optim/optim_kernels.h"
#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/half.h"
#include "kiln/optim/optimizer.h"
#include "kiln/runtime/memory.h"
#include "kiln/tensor.h"

namespace kiln::optim::detail {

// The open upper bound of check_range: "finite".
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// ValueError "[<who>] ..." for an empty list, an undefined, non-floating, non-leaf,
// non-contiguous or grad-less parameter, or one listed twice.
void check_params(std::string_view who, const std::vector<Tensor>& params);
// ValueError "[<who>] beta1 must be in [0, 1), got 1.5" unless v is finite and within the
// bounds (each open or closed; an infinite hi reads "finite and >= lo").
void check_range(std::string_view who, std::string_view what, double v, double lo, bool lo_open, double hi,
                 bool hi_open);
// v as messages write it: "1.5", "1e-08".
std::string num_str(double v);
// f16/bf16 parameters keep f32 state; the others keep their own dtype.
DType state_dtype(DType param);

// Calls f.template operator()<T>() with T the host storage type of a floating dtype.
template <class F>
void visit_floating(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    case DType::f16: return f.template operator()<Half>();
    case DType::bf16: return f.template operator()<BFloat16>();
    default: throw DTypeError("[optim] no update for dtype " + std::string(dtype_name(t)));
  }
}

}  // namespace kiln::optim::detail

namespace kiln {
struct LowPrecisionCopy;
}

namespace kiln::optim::detail {

// Points slot k of ts at p's low-precision copy (autocast's, engine/ops/amp.cpp) when it is
// current, so the update writes it beside p; returns it, or null. Call low_precision_written
// after p's version was bumped.
LowPrecisionCopy* low_precision_target(const Tensor& p, kernels::OptimTensors& ts, int k);
void low_precision_written(const Tensor& p, LowPrecisionCopy* lp);
// The stream an update launch on `d` goes on: the device's, or the stream an early update runs
// on (Optimizer::update_early) while it runs.
const rt::Stream& update_stream(Device d);
// Moves entry k of ts, filled for the whole of p, to the span s of it (state in state_dtype).
void narrow_to_span(kernels::OptimTensors& ts, int k, const Tensor& p, const ParamSpan& s);
// Entry k of ts takes its gradient as the split rows sums[k], where not null (update_gpu's).
void set_split_sums(kernels::OptimTensors& ts, const std::vector<const kernels::SplitSums*>& sums);

}  // namespace kiln::optim::detail
