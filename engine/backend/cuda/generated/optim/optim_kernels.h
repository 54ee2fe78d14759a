#pragma once
// The optimizer family (kernel_templates/optim.cu): the fused multi-tensor SGD and Adam updates
// and GradScaler's unscale, one launch for up to OptimTensors::kMax parameters of one dtype, and
// the scale update. The optimizers in engine/optim fill the lists and call these.
#include <cstdint>

#include "backend/cuda/split_sums.h"
#include "kiln/dtype.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/memory.h"

namespace kiln::kernels {

// Up to kMax parameters of one dtype t updated by one launch: p, g the parameter and its
// gradient, contiguous; s0, s1 the state arrays (f32 for f16/bf16 parameters, else t) (SGD: the momentum buffer,
// or 0 without momentum, with flags 1 on its first step, when it becomes a copy of g; Adam:
// exp_avg, exp_avg_sq). step: the optimizer's per-step doubles on the device (step_values);
// skip: an f32 flag on the device that, when nonzero, makes the launch change nothing (0: none).
struct OptimTensors {
  static constexpr int kMax = 32;
  rt::DevicePtr p[kMax] = {}, g[kMax] = {}, s0[kMax] = {}, s1[kMax] = {};
  // SGD and Adam also write each updated parameter, cast, to lp when lp_kind is 1 (f16) or 2
  // (bf16): autocast's copy of it (0: none).
  rt::DevicePtr lp[kMax] = {};
  // SGD and Adam take a gradient given as a split's rows (set_split_sums): ws its f32 rows x n[k]
  // workspace, rows > 0; the launch sums them into g (also when skip is set) and updates from
  // the sums. 0: g holds the gradient.
  rt::DevicePtr ws[kMax] = {};
  std::int64_t n[kMax] = {};
  std::int32_t flags[kMax] = {};
  std::int32_t lp_kind[kMax] = {};
  std::int32_t rows[kMax] = {};
  int count = 0;
};
// Entry k of ts (a whole parameter of sums.columns elements) takes its gradient as sums' rows.
// ValueError when the width, the row count (1 to 2^31 - 1) or the block size does not fit.
void set_split_sums(OptimTensors& ts, int k, const SplitSums& sums);
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
