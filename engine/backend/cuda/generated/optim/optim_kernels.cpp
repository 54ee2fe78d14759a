// Kernel specs and host launchers of kernel_templates/optim.cu: one tuple (t) per floating
// parameter dtype, and the scale update (f32 only).
#include "optim_kernels.h"

#include <climits>
#include <cstdint>
#include <string>
#include <utility>

#include "backend/cuda/launch_common.h"
#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/templates.h"

namespace kiln::kernels {

namespace {

using rt::KernelSpec;

// f16/bf16 parameters keep f32 state and compute in f32; f64 stays f64. Every instance binds
// both half headers (SGD and Adam also write autocast's f16/bf16 copies of the parameters) and
// the split's column sums (row_sums.cu), which SGD and Adam make for a gradient given as rows.
const KernelSpec& register_optim_entry(const char* op, const char* entry) {
  return register_float_spec(op, "optim", entry, "S", true, {{"ROW_SUMS", "row_sums"}});
}

const KernelSpec& kSgd = register_optim_entry("sgd_step", "kiln_sgd_step");
const KernelSpec& kAdam = register_optim_entry("adam_step", "kiln_adam_step");
const KernelSpec& kUnscale = register_optim_entry("unscale_grads", "kiln_unscale_grads");

// The scale update reads no tensor of a parameter's dtype: one f32 instance.
const KernelSpec& register_update_scale() {
  KernelSpec s;
  s.op = "update_scale";
  s.template_name = "optim";
  s.entry = "kiln_update_scale";
  s.dtypes = {DTypes{DType::f32}};
  s.bind = [](const DTypes&, std::uint32_t) -> rt::Bindings {
    return {{"PRELUDE", rt::device_prelude(DTypes{DType::f32, DType::f16, DType::bf16})},
            {"T", "float"},
            {"S", "float"},
            {"ROW_SUMS", rt::template_source("row_sums")}};
  };
  return rt::register_kernel(std::move(s));
}

const KernelSpec& kUpdateScale = register_update_scale();

rt::Function optim_function(const KernelSpec& spec, DType t, const rt::Stream& s) {
  return rt::get_function(spec, DTypes{t}, 0, s.device());
}

// The kernels' TensorList, field for field (kernel_templates/optim.cu).
struct TensorListArg {
  std::uint64_t p[OptimTensors::kMax], g[OptimTensors::kMax], s0[OptimTensors::kMax], s1[OptimTensors::kMax];
  std::uint64_t lp[OptimTensors::kMax];
  std::uint64_t ws[OptimTensors::kMax];
  std::int64_t n[OptimTensors::kMax];
  std::int64_t first_block[OptimTensors::kMax + 1];
  std::int32_t flags[OptimTensors::kMax];
  std::int32_t lp_kind[OptimTensors::kMax];
  std::int32_t rows[OptimTensors::kMax];
  std::int32_t count;
};

constexpr std::int64_t kChunk = 1024;       // elements per block, KILN_CHUNK in optim.cu
constexpr std::int64_t kSplitColumns = 32;  // a split gradient's columns per block, KILN_SPLIT_COLUMNS

// The argument and the grid: one block per chunk of every tensor.
TensorListArg list_arg(const OptimTensors& ts, rt::LaunchConfig& cfg) {
  if (ts.count < 1 || ts.count > OptimTensors::kMax)
    throw ValueError("[optim] a fused update takes 1 to " + std::to_string(OptimTensors::kMax) + " tensors, got " +
                     std::to_string(ts.count));
  TensorListArg a{};
  std::int64_t blocks = 0;
  for (int t = 0; t < ts.count; ++t) {
    a.p[t] = ts.p[t];
    a.g[t] = ts.g[t];
    a.s0[t] = ts.s0[t];
    a.s1[t] = ts.s1[t];
    a.lp[t] = ts.lp[t];
    a.lp_kind[t] = ts.lp_kind[t];
    a.ws[t] = ts.rows[t] > 0 ? ts.ws[t] : 0;
    a.rows[t] = ts.rows[t] > 0 ? ts.rows[t] : 0;
    a.n[t] = ts.n[t];
    a.flags[t] = ts.flags[t];
    a.first_block[t] = blocks;
    const std::int64_t per = a.rows[t] > 0 ? kSplitColumns : kChunk;
    blocks += (ts.n[t] + per - 1) / per;
  }
  a.first_block[ts.count] = blocks;
  a.count = ts.count;
  cfg.grid.x = static_cast<unsigned>(blocks);
  cfg.block.x = 256;
  return a;
}

}  // namespace

void set_split_sums(OptimTensors& ts, int k, const SplitSums& sums) {
  if (k < 0 || k >= OptimTensors::kMax || sums.threads != kSplitSumThreads || sums.rows < 1 || sums.rows > INT_MAX ||
      sums.columns != ts.n[k] || sums.ws == 0)
    throw ValueError("[optim] a gradient given as a split's rows needs the parameter's " +
                     std::to_string(k >= 0 && k < OptimTensors::kMax ? ts.n[k] : -1) +
                     " columns of 1 to 2^31 - 1 rows, summed by " + std::to_string(kSplitSumThreads) +
                     " threads a block; got " + std::to_string(sums.rows) + " x " + std::to_string(sums.columns) +
                     " rows by " + std::to_string(sums.threads));
  ts.ws[k] = sums.ws;
  ts.rows[k] = static_cast<std::int32_t>(sums.rows);
}

void launch_sgd_step(DType t, const OptimTensors& ts, rt::DevicePtr step, rt::DevicePtr skip, double momentum,
                     double dampening, double weight_decay, bool nesterov, const rt::Stream& s) {
  rt::LaunchConfig cfg;
  const TensorListArg a = list_arg(ts, cfg);
  if (cfg.grid.x == 0) return;
  const std::int32_t nest = nesterov ? 1 : 0;
  rt::launch(optim_function(kSgd, t, s), cfg, s, a, step, skip, momentum, dampening, weight_decay, nest);
}

void launch_adam_step(DType t, const OptimTensors& ts, rt::DevicePtr step, rt::DevicePtr skip, double beta1,
                      double beta2, double eps, double weight_decay, bool decoupled, const rt::Stream& s) {
  rt::LaunchConfig cfg;
  const TensorListArg a = list_arg(ts, cfg);
  if (cfg.grid.x == 0) return;
  const std::int32_t dec = decoupled ? 1 : 0;
  rt::launch(optim_function(kAdam, t, s), cfg, s, a, step, skip, beta1, beta2, eps, weight_decay, dec);
}

void launch_unscale_grads(DType t, const OptimTensors& ts, rt::DevicePtr scale, rt::DevicePtr found_inf,
                          const rt::Stream& s) {
  rt::LaunchConfig cfg;
  const TensorListArg a = list_arg(ts, cfg);
  if (cfg.grid.x == 0) return;
  rt::launch(optim_function(kUnscale, t, s), cfg, s, a, scale, found_inf);
}

void launch_update_scale(rt::DevicePtr scale, rt::DevicePtr clean_steps, rt::DevicePtr found_inf, double growth,
                         double backoff, std::int64_t interval, const rt::Stream& s) {
  rt::LaunchConfig cfg;
  cfg.block.x = 32;
  rt::launch(optim_function(kUpdateScale, DType::f32, s), cfg, s, scale, clean_steps, found_inf, growth, backoff, interval);
}

}  // namespace kiln::kernels
