// Kernel specs and host launchers of kernel_templates/softmax.cu: softmax/log_softmax over
// contiguous rows, the gather/scatter kernels of nll_loss, the fused softmax cross-entropy
// and prod's exclusive products.
// One tuple (t) per floating dtype; the launchers are declared where they are used
// (engine/ops/softmax.cpp, loss.cpp, cross_entropy.cpp, reduction.cpp).
#include <algorithm>
#include <string>

#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/templates.h"
#include "launchers.h"

namespace kiln::kernels {

namespace {

using rt::KernelSpec;

const rt::KernelSpec& register_entry(const char* op, const char* entry) {
  return register_float_spec(op, "softmax", entry, "ACC");
}

const KernelSpec& kSoftmax = register_entry("softmax", "kiln_softmax");
const KernelSpec& kNllForward = register_entry("nll_loss", "kiln_nll_forward");
const KernelSpec& kNllBackward = register_entry("nll_loss_backward", "kiln_nll_backward");
const KernelSpec& kCrossEntropy = register_entry("softmax_cross_entropy", "kiln_softmax_cross_entropy");
const KernelSpec& kCrossEntropyBackward =
    register_entry("softmax_cross_entropy_backward", "kiln_softmax_cross_entropy_backward");
const KernelSpec& kExclusiveProd = register_entry("exclusive_prod", "kiln_exclusive_prod");

constexpr unsigned kBlock = 256;  // fixed by the template

rt::Function function(const KernelSpec& spec, DType t, const rt::Stream& s) {
  return rt::get_function(spec, DTypes{t}, 0, s.device());
}

// A warp per row while a row is at most 32 loads per lane, else a block per row; at least
// one block (the cross-entropy's last block writes the reduction even for no rows).
struct RowLaunch {
  rt::LaunchConfig config;
  std::int32_t width = 32;
};
RowLaunch row_launch(std::int64_t rows, std::int64_t cols, const rt::Stream& s) {
  RowLaunch l;
  l.width = cols <= 1024 ? 32 : static_cast<int>(kBlock);
  const std::int64_t per_block = kBlock / l.width;
  const std::int64_t sms = std::max(1, rt::device_info(s.device()).sm_count);
  l.config.grid.x =
      static_cast<unsigned>(std::clamp<std::int64_t>((rows + per_block - 1) / per_block, 1, sms * 32));
  l.config.block.x = kBlock;
  return l;
}

}  // namespace

void launch_softmax(DType t, rt::DevicePtr in, rt::DevicePtr out, std::int64_t rows, std::int64_t cols, bool log_mode,
                    const rt::Stream& s) {
  if (rows == 0 || cols == 0) return;
  const RowLaunch l = row_launch(rows, cols, s);
  const long long r = rows, n = cols;
  const std::int32_t lm = log_mode ? 1 : 0;
  rt::launch(function(kSoftmax, t, s), l.config, s, in, out, r, n, l.width, lm);
}

// One launch for any N, even 0 (the last block writes count and the reduction). reduction:
// 0 none, 1 sum, 2 mean; rows: Acc scratch of N for sum and mean; stats: N lse, then count.
void launch_cross_entropy(DType t, rt::DevicePtr logits, rt::DevicePtr labels, rt::DevicePtr out, rt::DevicePtr rows,
                          rt::DevicePtr stats, std::int64_t n, std::int64_t classes, int reduction, double smoothing,
                          std::int64_t ignore, bool has_ignore, const rt::Stream& s) {
  const RowLaunch l = row_launch(n, classes, s);
  const long long nn = n, cc = classes, ig = ignore;
  const std::int32_t red = reduction, hi = has_ignore ? 1 : 0;
  rt::launch(function(kCrossEntropy, t, s), l.config, s, logits, labels, out, rows, stats, nn, cc, l.width, red, smoothing,
             ig, hi);
}

void launch_cross_entropy_backward(DType t, rt::DevicePtr g, rt::DevicePtr logits, rt::DevicePtr labels,
                                   rt::DevicePtr stats, rt::DevicePtr dx, std::int64_t n, std::int64_t classes,
                                   int reduction, double smoothing, std::int64_t ignore, bool has_ignore,
                                   const rt::Stream& s) {
  if (n * classes == 0) return;
  const long long nn = n, cc = classes, ig = ignore;
  const std::int32_t red = reduction, hi = has_ignore ? 1 : 0;
  const rt::LaunchConfig c = grid_stride_config(static_cast<std::uint64_t>(n * classes), s.device());
  rt::launch(function(kCrossEntropyBackward, t, s), c, s, g, logits, labels, stats, dx, nn, cc, red, smoothing, ig, hi);
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
