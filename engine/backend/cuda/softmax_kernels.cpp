// Kernel specs and host launchers of kernel_templates/softmax.cu: softmax/log_softmax over
// contiguous rows, the gather/scatter kernels of nll_loss, the fused softmax cross-entropy
// and prod's exclusive products.
// One tuple (t) per floating dtype; the launchers are declared in softmax_kernels.h. The fused
// cross-entropy's tuples are (t, loss): its loss (LOSS) in t, or f32 for 16-bit logits.
#include <algorithm>
#include <string>

#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/templates.h"
#include "launch_common.h"
#include "softmax_kernels.h"

namespace kiln::kernels {

namespace {

using rt::KernelSpec;

const rt::KernelSpec& register_softmax_entry(const char* op, const char* entry, bool loss_tuples = false) {
  rt::KernelSpec s;
  s.op = op;
  s.template_name = "softmax";
  s.entry = entry;
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16})
    s.dtypes.push_back(loss_tuples ? DTypes{t, t} : DTypes{t});
  if (loss_tuples) s.dtypes.insert(s.dtypes.end(), {DTypes{DType::f16, DType::f32}, DTypes{DType::bf16, DType::f32}});
  s.bind = [](const DTypes& d, std::uint32_t) -> rt::Bindings {
    return {{"PRELUDE", rt::device_prelude(d)},
            {"T", std::string(cuda_storage_type(d[0]))},
            {"ACC", d[0] == DType::f64 ? "double" : "float"},
            {"LOSS", std::string(cuda_storage_type(d.size() > 1 ? d[1] : d[0]))}};
  };
  return rt::register_kernel(std::move(s));
}

const KernelSpec& kSoftmax = register_softmax_entry("softmax", "kiln_softmax");
const KernelSpec& kNllForward = register_softmax_entry("nll_loss", "kiln_nll_forward");
const KernelSpec& kNllBackward = register_softmax_entry("nll_loss_backward", "kiln_nll_backward");
const KernelSpec& kCrossEntropy = register_softmax_entry("softmax_cross_entropy", "kiln_softmax_cross_entropy", true);
const KernelSpec& kCrossEntropyBackward =
    register_softmax_entry("softmax_cross_entropy_backward", "kiln_softmax_cross_entropy_backward", true);
const KernelSpec& kExclusiveProd = register_softmax_entry("exclusive_prod", "kiln_exclusive_prod");

rt::Function function(const KernelSpec& spec, DType t, const rt::Stream& s) {
  return rt::get_function(spec, DTypes{t}, 0, s.device());
}

// The cross-entropy kernels for logits t and a loss of `loss` (the registry refuses any pair but
// (t, t) and a 16-bit t's f32).
rt::Function cross_entropy_function(const KernelSpec& spec, DType t, DType loss, const rt::Stream& s) {
  return rt::get_function(spec, DTypes{t, loss}, 0, s.device());
}

}  // namespace

void launch_softmax(DType t, rt::DevicePtr in, rt::DevicePtr out, std::int64_t rows, std::int64_t cols, bool log_mode,
                    const rt::Stream& s) {
  if (rows == 0 || cols == 0) return;
  const RowLaunch l = row_launch(rows, cols, s.device());
  const long long r = rows, n = cols;
  const std::int32_t lm = log_mode ? 1 : 0;
  rt::launch(function(kSoftmax, t, s), l.config, s, in, out, r, n, l.width, lm);
}

// One launch for any N, even 0 (the last block writes count and the reduction). reduction:
// 0 none, 1 sum, 2 mean; rows: Acc scratch of N for sum and mean; stats: N lse, then count.
void launch_cross_entropy(DType t, DType loss, rt::DevicePtr logits, rt::DevicePtr labels, rt::DevicePtr out,
                          rt::DevicePtr rows, rt::DevicePtr stats, rt::DevicePtr unit_dx, std::int64_t n,
                          std::int64_t classes, int reduction, double smoothing, std::int64_t ignore, bool has_ignore,
                          const rt::Stream& s) {
  const RowLaunch l = row_launch(n, classes, s.device());
  const long long nn = n, cc = classes, ig = ignore;
  const std::int32_t red = reduction, hi = has_ignore ? 1 : 0;
  rt::launch(cross_entropy_function(kCrossEntropy, t, loss, s), l.config, s, logits, labels, out, rows, stats, unit_dx,
             nn, cc, l.width, red, smoothing, ig, hi);
}

void launch_cross_entropy_backward(DType t, DType loss, rt::DevicePtr g, rt::DevicePtr logits, rt::DevicePtr labels,
                                   rt::DevicePtr stats, rt::DevicePtr dx, std::int64_t n, std::int64_t classes,
                                   int reduction, double smoothing, std::int64_t ignore, bool has_ignore,
                                   const rt::Stream& s) {
  if (n * classes == 0) return;
  const long long nn = n, cc = classes, ig = ignore;
  const std::int32_t red = reduction, hi = has_ignore ? 1 : 0;
  const rt::LaunchConfig c = grid_stride_config(static_cast<std::uint64_t>(n * classes), s.device());
  rt::launch(cross_entropy_function(kCrossEntropyBackward, t, loss, s), c, s, g, logits, labels, stats, dx, nn, cc, red,
             smoothing, ig, hi);
}

void launch_nll_forward(DType t, rt::DevicePtr lp, rt::DevicePtr labels, rt::DevicePtr loss, rt::DevicePtr valid,
                        std::int64_t m, std::int64_t classes, std::int64_t inner, std::int64_t ignore, bool has_ignore,
                        const rt::Stream& s) {
  if (m == 0) return;
  const long long mm = m, cc = classes, ii = inner, ig = ignore;
  const std::int32_t hi = has_ignore ? 1 : 0;
  rt::launch(function(kNllForward, t, s), grid_stride_config(static_cast<std::uint64_t>(m), s.device()), s, lp, labels,
             loss, valid, mm, cc, ii, ig, hi);
}

void launch_nll_backward(DType t, rt::DevicePtr g, rt::DevicePtr labels, rt::DevicePtr grad, std::int64_t total,
                         std::int64_t classes, std::int64_t inner, std::int64_t ignore, bool has_ignore,
                         const rt::Stream& s) {
  if (total == 0) return;
  const long long tt = total, cc = classes, ii = inner, ig = ignore;
  const std::int32_t hi = has_ignore ? 1 : 0;
  rt::launch(function(kNllBackward, t, s), grid_stride_config(static_cast<std::uint64_t>(total), s.device()), s, g,
             labels, grad, tt, cc, ii, ig, hi);
}

// One thread per row: rows are short (the elements one prod reduced) and few passes.
void launch_exclusive_prod(DType t, rt::DevicePtr in, rt::DevicePtr out, std::int64_t rows, std::int64_t cols,
                           const rt::Stream& s) {
  if (rows == 0 || cols == 0) return;
  const long long r = rows, n = cols;
  rt::launch(function(kExclusiveProd, t, s), grid_stride_config(static_cast<std::uint64_t>(rows), s.device()), s, in,
             out, r, n);
}

}  // namespace kiln::kernels
