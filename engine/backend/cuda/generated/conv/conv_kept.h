#pragma once
// Staged copies of a conv's operands that later launches on this thread read instead of staging
// their own: the tile engine's NHWC copies under a ConvStagingReuse, and a forward's copies kept
// for its backward under a ConvForBackward (conv_run.h): the tile engine's NHWC images and flipped
// weights, and the patch kind's flipped weights.
#include <cstdint>
#include <memory>

#include "kiln/dtype.h"
#include "kiln/runtime/memory.h"

namespace kiln::kernels::kept {

enum class CopyOf { images, flipped_weights, patch_flipped_weights };

// A copy's source, shape, staged dtype, slices and stream (images: channels, pixels and images;
// flipped weights: the input gradient's c, taps and m; the patch kind's: its channel run, taps and
// channels).
struct KeptCopy {
  rt::DevicePtr src;
  std::int64_t c, pixels, batch;
  DType t;
  int slices;
  const void* stream;
  std::shared_ptr<const rt::DeviceBuffer> copy;
  CopyOf of = CopyOf::images;
};

// The ConvForBackward for the operand at `ptr` (innermost, of the images or the weights), or null.
struct OperandScope {
  rt::DevicePtr ptr;
  std::weak_ptr<const void> owner;
  std::uint64_t version;
};
const OperandScope* images_scope(rt::DevicePtr ptr);
const OperandScope* weights_scope(rt::DevicePtr ptr);

// The forward's copy for this backward pass, taken from the kept ones; null for none. A shape-only
// pass's copies (planned addresses) serve only that pass.
std::shared_ptr<const rt::DeviceBuffer> take_for_backward(const KeptCopy& key, const OperandScope& scope);
void keep_for_backward(const KeptCopy& copy, const OperandScope& scope);

// Under a ConvStagingReuse: the copy made earlier for `key` (null for none), and keeping one.
bool reusing();
std::shared_ptr<const rt::DeviceBuffer> reused(const KeptCopy& key);
void keep_for_reuse(const KeptCopy& copy);

}  // namespace kiln::kernels::kept
