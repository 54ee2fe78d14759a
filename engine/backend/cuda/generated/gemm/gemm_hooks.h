#pragma once
// Pointwise work the GEMM tile engine does on the way in and out, so that a fused step needs no
// pass of its own: a prologue on each element of A as its tile lands in shared memory, and an
// epilogue on each f32 sum before it is stored. Both are CUDA float expressions in the fusion
// language's device text (expr::to_cuda: values in `C`, params as `p0`, `p1`, ...) over named
// extra operands; the step compiler fills them from the OpDefs' expressions.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/runtime/generated_kernels.h"

namespace kiln::kernels {

// Which value of an extra operand goes with output element (row, col) of problem z: one per
// row, one per column, or one per element (a matrix of row stride `ld`). A prologue's operands
// hold one value per k.
enum class HookIndex { row = 0, column = 1, element = 2 };

struct HookInput {
  std::string name;  // as the expression spells it: a C identifier
  DType dtype = DType::f32;  // f32, bf16 or f16, widened to float
  HookIndex index = HookIndex::column;
  std::int64_t ld = 0;            // HookIndex::element: elements from one row to the next
  std::int64_t batch_stride = 0;  // elements from one problem's values to the next's (0: shared)
};

// Batch-norm statistics of the stored values, per row or per column: partial sums and sums of
// squares in f32 (GemmStatsShape says how many partials and where they go).
enum class HookStats { none = 0, rows = 1, columns = 2 };

inline constexpr int kMaxHookInputs = 6;

struct GemmEpilogueHook {
  std::string expr{};  // over `acc` (the f32 sum), `row`, `col` and the inputs; empty: acc
  std::vector<HookInput> inputs{};
  std::vector<double> params{};      // p0, p1, ... (part of the kernel: the key holds them)
  std::optional<DType> out{};        // D's dtype (f32, bf16 or f16); none: the inputs' dtype
  bool accumulate = false;           // D += value, summed in f32 (a gradient accumulating)
  HookStats stats = HookStats::none;
};

// Applied to each element of A once its tile has landed, rounded back to A's dtype as a pass
// that stored A would round it: `expr` over `a` (the element widened to float), `k` and the
// inputs, each holding one value per k. Past K, A stays zero.
struct GemmPrologueHook {
  std::string expr{};
  std::vector<HookInput> inputs{};
  std::vector<double> params{};
};

struct GemmHooks {
  std::optional<GemmEpilogueHook> epilogue;
  std::optional<GemmPrologueHook> prologue;
  bool empty() const { return !epilogue && !prologue; }
  void add_to(rt::GeneratedKey& key) const;  // a digest of the whole description
  std::string text() const;                  // "" or " hooks:<16 hex digits>", the tuner's problem text
};

// The statistics' partials: stats[part * channels + c] holds the sum of channel c's stored values
// over one part of the other dimension (a tile's; a CTA's tiles' where one tile spans the
// channels), and stats[(parts + part) * channels + c] their squares. Every partial is written,
// so their sum over parts is the statistic.
struct GemmStatsShape {
  std::int64_t parts = 0, channels = 0;
  std::int64_t floats() const { return 2 * parts * channels; }
};

// Whether the hooks only take D's row statistics of the values as the plain product stores them
// (no prologue; an epilogue without expression, inputs, params, accumulation or dtype of its
// own): convolution mode's tiles of D^T can take those as their columns' sums.
bool row_statistics_alone(const GemmHooks& h);

// What is wrong with the hooks, or "" when nothing is.
std::string hook_problem(const GemmHooks& h);

// The source of `epilogue(acc, row, col, z, hp)` and `prologue(a, k, z, hp)` (hp holding the
// operands' pointers) and the constants the template reads (kPrologue, kAccumulate, kStats).
struct HookSource {
  std::string functions, constants;
};
HookSource hook_source(const GemmHooks& h);

}  // namespace kiln::kernels
