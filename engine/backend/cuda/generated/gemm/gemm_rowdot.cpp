// The GEMM family's row kind (kernel_templates/gemm_rowdot.cu): D of at most 32 columns, a warp
// per row of D summing all of k, so a product of an output layer (10 logits over 512 features)
// is one kernel where the tiled kinds split k among blocks and add the splits after. Its plan,
// warps per block, source, operand check and launch.
#include <algorithm>
#include <string>

#include "backend/cuda/launch_common.h"
#include "gemm_internal.h"
#include "kiln/error.h"
#include "kiln/runtime/launch.h"
#include "kiln/runtime/module_cache.h"
#include "kiln/runtime/templates.h"

namespace kiln::kernels {

namespace {

constexpr std::int64_t kMostColumns = 32;  // a lane stores one column

// Elements a lane loads at once: 16 bytes' worth where k and both row strides are multiples of it.
int vec_of(const GemmGeometry& g) {
  const std::int64_t v = 16 / static_cast<std::int64_t>(dtype_size(input_dtype(g.math)));
  return g.k % v == 0 && g.lda % v == 0 && g.ldb % v == 0 ? static_cast<int>(v) : 1;
}

bool warps_fit(int warps) { return warps >= 1 && warps <= 16 && (warps & (warps - 1)) == 0; }

}  // namespace

// Four rows a block, or fewer where that leaves over half the SMs without a block.
std::optional<GemmLaunch> plan_rowdot(const GemmGeometry& g, const GemmTarget& target, GemmTile tile) {
  if (g.conv || g.batch != 1 || g.hooks.epilogue || g.hooks.prologue || g.a_mn || g.b_mn || tile.transposed ||
      tile.splits > 1)
    return std::nullopt;
  if (g.m < 1 || g.n < 1 || g.n > kMostColumns || g.k < 1 || g.lda < g.k || g.ldb < g.k || g.ldd < g.n)
    return std::nullopt;
  GemmLaunch l;
  l.kernel = GemmKernel::rowdot;
  l.g = g;
  l.bn = static_cast<int>(g.n);
  l.bm = tile.bm > 0 ? tile.bm : 4;
  if (tile.bm == 0)
    while (l.bm > 1 && 2 * ceil_div(g.m, l.bm) < std::max(1, target.sm_count)) l.bm /= 2;
  if (!warps_fit(l.bm) || ceil_div(g.m, l.bm) > 0x7fffffff) return std::nullopt;
  l.stages = 1;
  l.grid = static_cast<int>(ceil_div(g.m, l.bm));
  return l;
}

std::vector<GemmTile> rowdot_alternatives(const GemmLaunch& h) {
  std::vector<GemmTile> out;
  for (int warps : {1, 2, 4, 8})
    if (warps != h.bm) out.push_back({warps, h.bn});
  return out;
}

namespace {

// The row template's bindings, with `prelude` as its ${PRELUDE}.
rt::Bindings rowdot_bindings(const GemmLaunch& l, std::string prelude) {
  rt::Bindings b = plain_product_bindings(l);
  b.insert(b.end(), {{"PRELUDE", std::move(prelude)},
                     {"IN", std::string(cuda_storage_type(input_dtype(l.g.math)))},
                     {"VEC", std::to_string(vec_of(l.g))}});
  return b;
}

}  // namespace

std::string rowdot_source(const GemmLaunch& l) {
  return rt::instantiate("gemm_rowdot", rt::template_source("gemm_rowdot"),
                         rowdot_bindings(l, prelude_for(l.g, l.g.hooks)));
}

// 16-byte bases where a lane loads 16 bytes, the dtype's alignment elsewhere; the bias given
// with a built-in epilogue.
bool rowdot_operands_fit(const GemmLaunch& l, const GemmOperands& ops) {
  const std::uint64_t size = dtype_size(input_dtype(l.g.math));
  const std::uint64_t vec = vec_of(l.g) > 1 ? 16 : size;
  auto aligned = [](rt::DevicePtr p, std::uint64_t to) { return p != 0 && p % to == 0; };
  return aligned(ops.a, vec) && aligned(ops.b, vec) && aligned(ops.d, size) &&
         (l.g.epilogue == GemmEpilogue::none || aligned(ops.bias, size));
}

void launch_rowdot(const GemmLaunch& l, const GemmOperands& ops, const rt::Function& fn) {
  rt::LaunchConfig cfg;
  cfg.grid = {static_cast<unsigned>(l.grid), 1, 1};
  cfg.block = {static_cast<unsigned>(32 * l.bm), 1, 1};
  rt::launch(fn, cfg, *ops.stream, ops.a, ops.b, ops.d, ops.bias);
}

// softmax.cu's cross-entropy rows for logits of the inputs' dtype and a loss of `loss`, then the
// row template's fused kernel (its prelude and wait line are softmax.cu's).
std::string rowdot_cross_entropy_source(const GemmLaunch& l, DType loss) {
  const DType t = input_dtype(l.g.math);
  const rt::Bindings ce{{"PRELUDE", rt::device_prelude(DTypes{t, loss})},
                        {"T", std::string(cuda_storage_type(t))},
                        {"ACC", "float"},
                        {"LOSS", std::string(cuda_storage_type(loss))}};
  return "#define KILN_CROSS_ENTROPY_ROWS 1\n#define KILN_ROWDOT_CROSS_ENTROPY 1\n" +
         rt::instantiate("softmax", rt::template_source("softmax"), ce) +
         rt::instantiate("gemm_rowdot", rt::template_source("gemm_rowdot"), rowdot_bindings(l, ""));
}

namespace {

constexpr const char* kRowdotCrossEntropy = "kiln_gemm_rowdot_cross_entropy";

std::span<const rt::KernelSpec* const> rowdot_cross_entropy_module(const GemmLaunch& l, DType loss) {
  rt::GeneratedKey key("gemm_rowdot_cross_entropy");
  key.add(l.bm, static_cast<int>(loss));
  l.g.add_to(key);
  return rt::generated_kernels(key, [&] {
    return rt::GeneratedModule{
        rowdot_cross_entropy_source(l, loss), "gemm " + l.text() + " cross-entropy", {kRowdotCrossEntropy}};
  });
}

}  // namespace

void load_rowdot_cross_entropy(const GemmLaunch& l, DType loss, int device) {
  (void)rt::generated_function(rowdot_cross_entropy_module(l, loss), kRowdotCrossEntropy, device);
}

bool rowdot_cross_entropy_loaded(const GemmLaunch& l, DType loss, int device) {
  for (const rt::KernelSpec* spec : rowdot_cross_entropy_module(l, loss))
    if (spec->entry == kRowdotCrossEntropy)
      return rt::function_if_cached(*spec, rt::generated_dtypes(), 0, device, false).has_value();
  return false;
}

bool rowdot_masked_dx_in_one_slice(const GemmLaunch& l) { return l.g.k <= 32 * vec_of(l.g); }

bool rowdot_cross_entropy_fits(const GemmLaunch& l) {
  return l.kernel == GemmKernel::rowdot && l.g.ldd == l.g.n && l.g.epilogue != GemmEpilogue::relu_bias;
}

void launch_rowdot_cross_entropy(const GemmLaunch& l, const GemmOperands& ops, const RowCrossEntropy& ce) {
  if (!rowdot_cross_entropy_fits(l) || !ops.stream || !rowdot_operands_fit(l, ops))
    throw ValueError("[gemm] " + l.text() +
                     ": the cross-entropy of its rows needs the row kind with rows of n, no "
                     "ReLU, aligned operands and a stream");
  const rt::Function fn =
      rt::generated_function(rowdot_cross_entropy_module(l, ce.loss), kRowdotCrossEntropy, ops.stream->device());
  // softmax.cu's rows at a warp each (row_launch's width for n <= 32): the same blocks.
  const RowLaunch rows = row_launch(l.g.m, l.g.n, ops.stream->device());
  const std::int32_t red = ce.reduction, hi = ce.has_ignore ? 1 : 0;
  const long long ig = ce.ignore;
  const rt::DevicePtr masked_dx = ce.unit_dx ? ce.masked_dx : 0;
  rt::launch(fn, rows.config, *ops.stream, ops.a, ops.b, ops.d, ops.bias, ce.labels, ce.out, ce.rows, ce.stats,
             ce.unit_dx, red, ce.smoothing, ig, hi, masked_dx);
}

std::optional<GemmLaunch> plan_rowdot_input_grad(DType t, std::int64_t m, std::int64_t n, std::int64_t k,
                                                 const GemmTarget& target) {
  const std::optional<GemmMath> math = t == DType::f32    ? std::optional(GemmMath::f32)
                                       : t == DType::bf16 ? std::optional(GemmMath::bf16)
                                       : t == DType::f16  ? std::optional(GemmMath::f16)
                                                          : std::nullopt;
  if (!math) return std::nullopt;
  // The forward's geometry: A (m x k) the ReLU's output, B (n x k) the weights, D (m x n).
  const GemmGeometry g{.m = m, .n = n, .k = k, .lda = k, .ldb = k, .ldd = n, .math = *math};
  return plan_rowdot(g, target, {});
}

std::string rowdot_input_grad_source(const GemmLaunch& l) {
  return "#define KILN_ROWDOT_INPUT_GRAD 1\n" + rowdot_source(l);
}

void launch_rowdot_input_grad(const GemmLaunch& l, rt::DevicePtr g, rt::DevicePtr w, rt::DevicePtr y, rt::DevicePtr dx,
                              const rt::Stream& s) {
  constexpr const char* kEntry = "kiln_gemm_rowdot_input_grad";
  rt::GeneratedKey key("gemm_rowdot_input_grad");
  key.add(l.bm);
  l.g.add_to(key);
  const auto module = rt::generated_kernels(key, [&] {
    return rt::GeneratedModule{rowdot_input_grad_source(l), "gemm " + l.text() + " masked input gradient", {kEntry}};
  });
  rt::LaunchConfig cfg;
  cfg.grid = {static_cast<unsigned>(l.grid), 1, 1};
  cfg.block = {static_cast<unsigned>(32 * l.bm), 1, 1};
  rt::launch(rt::generated_function(module, kEntry, s.device()), cfg, s, g, w, y, dx);
}

}  // namespace kiln::kernels
