#pragma once
// What the GEMM family's sources share inside the family: the shared-memory budget of a tile
// and the convolution modes' host side (gemm_conv.cpp): whether a geometry fits, the weight
// gradient's plan, and each launch's staged operands and tensor maps.
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gemm_plan.h"
#include "kiln/runtime/templates.h"
#include "kiln/runtime/tensor_map.h"

namespace kiln::kernels {

// Whether launch l's epilogue stores 16-byte pieces of D's rows through shared memory (its
// geometry, tile, box and splits set).
bool staged_stores(const GemmLaunch& l);
// Dynamic shared memory of l's stages, barriers, column-statistics scratch and store staging,
// and the most stages (up to 8) that fit the target, or 0.
std::int64_t shared_bytes(const GemmLaunch& l, int stages);
int stages_for(const GemmLaunch& l, const GemmTarget& t);
HookStats stats_of(const GemmGeometry& g);
// Whether l's statistics are its tiles' column sums: D's column statistics, or D's row
// statistics in tiles of D^T.
bool column_sums(const GemmLaunch& l);

// Convolution mode's f32 math stages its operands as two or three slices (GemmConv::paired);
// elsewhere the kernel splits f32 tiles itself (split_in_kernel) and every operand is one.
int slices(const GemmGeometry& g);
bool split_in_kernel(const GemmGeometry& g);
// Whether launch l reads A into registers: plain products transposed (TF32 or f32 with B
// MN-major), whose kernel A is B's matrix and kernel B is A's.
bool reg_a(const GemmLaunch& l);
// Convolution mode's channels as staged: c, or f32 math's slices of c.
std::int64_t staged_channels(const GemmGeometry& g);
// TF32 (and exact f32) with A MN-major and dense (k rows of m, k a multiple of 4), in a single
// product (a weight gradient's) or shared by a batch (a 1x1 convolution's weights): A is staged
// K-major per launch (by kiln_nchw_to_nhwc, as one image of k channels by m pixels).
bool stage_a_transposed(const GemmGeometry& g);
rt::DeviceBuffer transpose_a(const GemmLaunch& l, const GemmOperands& ops);
// Whether a convolution-mode geometry fits the kernel; ValueError where it contradicts its window.
bool conv_fits(const GemmGeometry& g);
// Tiles across D's columns in the convolution modes.
std::int64_t conv_tiles_n(const GemmGeometry& g, int bn, ConvBox box);
// Weight-gradient mode's plan from `l` (its geometry set).
std::optional<GemmLaunch> plan_wgrad(GemmLaunch l, const GemmTarget& target, GemmTile tile);

// A convolution launch's operands as the kernel reads them: the copies made for it (kept alive
// until its kernels are queued) and the tensor maps over them.
struct ConvStaging {
  rt::TensorMap map_a{}, map_b{};
  std::shared_ptr<const rt::DeviceBuffer> weights;  // shared with a later input gradient (ConvForBackward)
  std::shared_ptr<const rt::DeviceBuffer> images,
      grads;             // shared with later launches (ConvStagingReuse, ConvForBackward)
  rt::DeviceBuffer odd;  // paired slices: one word, nonzero where either operand holds inf or NaN
};
ConvStaging stage_conv(const GemmLaunch& l, const GemmOperands& ops);
// What the plain-product kinds' templates share: the tile (BM, BN), the sizes and row strides,
// the layouts (A_MN, B_MN) and the built-in epilogue.
rt::Bindings plain_product_bindings(const GemmLaunch& l);
// Whether each hook input has its pointer, aligned to its dtype.
bool hook_inputs_given(const std::vector<HookInput>& inputs, const std::array<rt::DevicePtr, kMaxHookInputs>& pointers);
// The device prelude with the headers of every dtype the kernel reads or writes.
std::string prelude_for(const GemmGeometry& g, const GemmHooks& h);
// The mma.sync kind (gemm_mma.cpp): its plan, other tiles, source, operand check and launch.
std::optional<GemmLaunch> plan_mma(const GemmGeometry& g, const GemmTarget& target, GemmTile tile);
std::vector<GemmTile> mma_alternatives(const GemmLaunch& h);
std::string mma_source(const GemmLaunch& l);
bool mma_operands_fit(const GemmLaunch& l, const GemmOperands& ops);
void launch_mma(const GemmLaunch& l, const GemmOperands& ops, const rt::Function& fn);
// The FFMA kind (gemm_ffma.cpp), likewise.
std::optional<GemmLaunch> plan_ffma(const GemmGeometry& g, const GemmTarget& target, GemmTile tile);
std::vector<GemmTile> ffma_alternatives(const GemmLaunch& h, const GemmTarget& target);
std::string ffma_source(const GemmLaunch& l);
bool ffma_operands_fit(const GemmLaunch& l, const GemmOperands& ops);
void launch_ffma(const GemmLaunch& l, const GemmOperands& ops, const rt::Function& fn);
// The row kind (gemm_rowdot.cpp), likewise.
std::optional<GemmLaunch> plan_rowdot(const GemmGeometry& g, const GemmTarget& target, GemmTile tile);
std::vector<GemmTile> rowdot_alternatives(const GemmLaunch& h);
std::string rowdot_source(const GemmLaunch& l);
bool rowdot_operands_fit(const GemmLaunch& l, const GemmOperands& ops);
void launch_rowdot(const GemmLaunch& l, const GemmOperands& ops, const rt::Function& fn);

// The staging kernels (gemm_staging.cpp, kernel_templates/gemm_staging.cu), compiled apart
// from the per-shape tile kernel: `kind` over inputs of dtype `in`, written as `slices` TF32
// slices (f32 only; 1: as stored).
enum class GemmStaging { weights_rsc, nchw_to_nhwc, shift_rows, sum_splits };
rt::Function staging_function(GemmStaging kind, DType in, int slices, int device);

// Weight-gradient mode and split-K: the splits' f32 partials added in order into D.
void sum_splits(const GemmLaunch& l, rt::DevicePtr parts, rt::DevicePtr d, const rt::Stream& stream);

}  // namespace kiln::kernels
