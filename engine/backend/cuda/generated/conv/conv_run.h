#pragma once
// An op's one call into the generated convolutions: every kind that applies, with its tile
// alternatives, as candidates for kernels::run_tuned, which runs the one measured fastest.
#include <cstdint>
#include <memory>

#include "conv_geometry.h"
#include "kiln/runtime/memory.h"

namespace kiln::kernels {

// Runs `pass` on a generated kernel; `no`, having done nothing, when none applies: generated
// convs switched off (KILN_CONV_IGEMM=0), a device before sm_80, an operand past 32-bit
// indexing, an empty output, or no kind for the dtypes (f64). `tf32`: f32 may take TF32.
// A forward given ops.totals and ops.stats (generated_conv_stats_floats of them) also takes its
// output's statistics where a kind that applies can (`with_totals`): the f64 totals, or the
// partials *ops.stats_rows says it parked.
// An input gradient given ops.pool_sums with its parts (generated_conv_pool_sums_floats of them)
// also parks that pooled batch norm's sums where a kind that applies can (`with_pool_sums`).
enum class ConvRan { no, yes, with_totals, with_pool_sums };
ConvRan run_generated_conv(ConvPass pass, const ConvGeometry& g, const ConvOperands& ops, bool tf32);
// The f32s of ConvOperands::stats that a forward taking its statistics needs; 0 where none can.
std::int64_t generated_conv_stats_floats(const ConvGeometry& g, const ConvOperands& ops, bool tf32);
// The f32s of ConvOperands::pool_sums->parts that an input gradient parking them needs; 0 where
// none can.
std::int64_t generated_conv_pool_sums_floats(const ConvGeometry& g, const ConvOperands& ops, bool tf32);

// Whether a weight gradient of these 16-bit operands can be summed into f32 by a generated
// kernel (the tile engine's weight-gradient mode, sm_90) on `device`, given aligned operands.
bool generated_conv_sums_f32(const ConvGeometry& g, DType dtype, int device);

// False when KILN_CONV_IGEMM=0 asks for im2col + cuBLAS everywhere.
bool generated_convs_enabled();

// While one lives on this thread, the tile engine's NHWC copies of an operand are kept and used
// again by later launches on the same stream: a conv's input and weight gradients both copy gy.
// Whoever makes one promises that no operand is written while it lives; the copies are freed
// when the last one ends.
class ConvStagingReuse {
 public:
  ConvStagingReuse();
  ~ConvStagingReuse();
  ConvStagingReuse(const ConvStagingReuse&) = delete;
  ConvStagingReuse& operator=(const ConvStagingReuse&) = delete;
};

// A forward's staged copy of an operand, kept for the backward pass that reads the same operand,
// which then stages none: the tile engine's one-slice NHWC copy of the images (taken by the
// weight gradient), or the flipped reorder of the weights that the forward's reorder also writes
// (taken by the input gradient). While one lives on this thread, the copy of the operand at
// `operand` is kept (a forward) or taken (a backward pass), under `owner` (the operand's storage)
// at `version`: a copy is used only while that storage lives, unwritten since. Kept copies whose
// storage has gone are freed at the next forward's.
enum class ConvStaged { images, weights };
class ConvForBackward {
 public:
  ConvForBackward(ConvStaged what, rt::DevicePtr operand, std::weak_ptr<const void> owner, std::uint64_t version);
  ~ConvForBackward();
  ConvForBackward(const ConvForBackward&) = delete;
  ConvForBackward& operator=(const ConvForBackward&) = delete;

 private:
  ConvStaged what_;
};
// Forward copies kept on this thread, of images and of flipped weights (tests).
std::size_t conv_images_kept();
std::size_t conv_weights_kept();

}  // namespace kiln::kernels
