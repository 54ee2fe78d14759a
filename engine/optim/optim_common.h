#pragma once
// Internal to engine/optim: argument checks shared by the optimizers, the dtype their
// state is kept in, and the fused GPU updates (engine/optim/optim_kernels.cpp).
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/half.h"
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

namespace kiln::kernels {
struct OptimTensors;
}

namespace kiln::optim::detail {

// Points slot k of ts at p's low-precision copy (autocast's, engine/ops/amp.cpp) when it is
// current, so the update writes it beside p; returns it, or null. Call low_precision_written
// after p's version was bumped.
LowPrecisionCopy* low_precision_target(const Tensor& p, kernels::OptimTensors& ts, int k);
void low_precision_written(const Tensor& p, LowPrecisionCopy* lp);

}  // namespace kiln::optim::detail

namespace kiln::kernels {

// Up to kMax parameters of one dtype t updated by one launch: p, g the parameter and its
// gradient, contiguous; s0, s1 the state arrays in state_dtype(t) (SGD: the momentum buffer,
// or 0 without momentum, with flags 1 on its first step, when it becomes a copy of g; Adam:
// exp_avg, exp_avg_sq). step: the optimizer's per-step doubles on the device (step_values);
// skip: an f32 flag on the device that, when nonzero, makes the launch change nothing (0: none).
struct OptimTensors {
  static constexpr int kMax = 32;
  rt::DevicePtr p[kMax] = {}, g[kMax] = {}, s0[kMax] = {}, s1[kMax] = {};
  // SGD and Adam also write each updated parameter, cast, to lp when lp_kind is 1 (f16) or 2
  // (bf16): autocast's copy of it (0: none).
  rt::DevicePtr lp[kMax] = {};
  std::int64_t n[kMax] = {};
  std::int32_t flags[kMax] = {};
  std::int32_t lp_kind[kMax] = {};
  int count = 0;
};
void launch_sgd_step(DType t, const OptimTensors& ts, rt::DevicePtr step, rt::DevicePtr skip, double momentum,
                     double dampening, double weight_decay, bool nesterov, const rt::Stream& s);
void launch_adam_step(DType t, const OptimTensors& ts, rt::DevicePtr step, rt::DevicePtr skip, double beta1,
                      double beta2, double eps, double weight_decay, bool decoupled, const rt::Stream& s);
// GradScaler: the gradients ts.g (of dtype t) divided in place by the f32 *scale, with the f32
// *found_inf set to 1 when one was inf or NaN; then the scale update (torch's _amp_update_scale_)
// of the f32 scale and the i64 count of clean steps.
void launch_unscale_grads(DType t, const OptimTensors& ts, rt::DevicePtr scale, rt::DevicePtr found_inf,
                          const rt::Stream& s);
void launch_update_scale(rt::DevicePtr scale, rt::DevicePtr clean_steps, rt::DevicePtr found_inf, double growth,
                         double backoff, std::int64_t interval, const rt::Stream& s);

}  // namespace kiln::kernels
