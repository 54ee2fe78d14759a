// Kernel specs and host launchers of kernel_templates/optim.cu: the fused SGD and Adam
// updates, one tuple (t) per floating parameter dtype. The launchers are declared where
// they are used (engine/optim/optim_common.h).
#include <string>

#include "kiln/dtype.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/templates.h"
#include "launchers.h"

namespace kiln::kernels {

namespace {

using rt::KernelSpec;

// f16/bf16 parameters keep f32 state and compute in f32; f64 stays f64.
const KernelSpec& register_entry(const char* op, const char* entry) {
  return register_float_spec(op, "optim", entry, "S");
}

const KernelSpec& kSgd = register_entry("sgd_step", "kiln_sgd_step");
const KernelSpec& kAdam = register_entry("adam_step", "kiln_adam_step");

rt::Function function(const KernelSpec& spec, DType t, const rt::Stream& s) {
  return rt::get_function(spec, DTypes{t}, 0, s.device());
}

}  // namespace

void launch_sgd_step(DType t, rt::DevicePtr param, rt::DevicePtr grad, rt::DevicePtr momentum_buffer, std::int64_t n,
                     rt::DevicePtr step, double momentum, double dampening, double weight_decay, bool nesterov,
                     bool first, const rt::Stream& s) {
  if (n == 0) return;
  const long long nn = n;
  const std::int32_t nest = nesterov ? 1 : 0, fst = first ? 1 : 0;
  rt::launch(function(kSgd, t, s), grid_stride_config(static_cast<std::uint64_t>(n), s.device()), s, param, grad,
             momentum_buffer, nn, step, momentum, dampening, weight_decay, nest, fst);
}

void launch_adam_step(DType t, rt::DevicePtr param, rt::DevicePtr grad, rt::DevicePtr exp_avg, rt::DevicePtr exp_avg_sq,
                      std::int64_t n, rt::DevicePtr step, double beta1, double beta2, double eps, double weight_decay,
                      bool decoupled, const rt::Stream& s) {
  if (n == 0) return;
  const long long nn = n;
  const std::int32_t dec = decoupled ? 1 : 0;
  rt::launch(function(kAdam, t, s), grid_stride_config(static_cast<std::uint64_t>(n), s.device()), s, param, grad,
             exp_avg, exp_avg_sq, nn, step, beta1, beta2, eps, weight_decay, dec);
}

}  // namespace kiln::kernels
