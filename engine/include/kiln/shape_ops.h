#pragma once
// Shape and movement ops. Views (permute, transpose, expand, squeeze, unsqueeze, flatten
// when the strides allow, slice, narrow, split, chunk) share the input's storage;
// cat, stack, pad, gather, index_select, scatter_add and one_hot write new tensors.
// Dims may be negative (counted from the end). Index tensors are i64 or i32.
#include <cstdint>
#include <limits>
#include <vector>

#include "scalar.h"
#include "tensor.h"

namespace kiln {

// "To the end of the dim" for slice stops.
inline constexpr std::int64_t kEnd = std::numeric_limits<std::int64_t>::max();

Tensor permute(const Tensor& a, const std::vector<std::int64_t>& dims);
Tensor transpose(const Tensor& a, std::int64_t dim0, std::int64_t dim1);
// As broadcast_to, with -1 keeping a dim's size (PyTorch's expand).
Tensor expand(const Tensor& a, const Shape& shape);
Tensor squeeze(const Tensor& a);                    // every size-1 dim
Tensor squeeze(const Tensor& a, std::int64_t dim);  // a dim whose size is not 1 stays
Tensor squeeze(const Tensor& a, const std::vector<std::int64_t>& dims);
Tensor unsqueeze(const Tensor& a, std::int64_t dim);  // dim in [-ndim-1, ndim]
// Merges dims start_dim..end_dim; a view when the strides allow, else a copy (as reshape).
Tensor flatten(const Tensor& a, std::int64_t start_dim = 0, std::int64_t end_dim = -1);

// Python slicing a[start:stop:step] along `dim`: negative start/stop count from the end,
// out-of-range bounds clamp, step > 0.
Tensor slice(const Tensor& a, std::int64_t dim, std::int64_t start, std::int64_t stop = kEnd, std::int64_t step = 1);
struct SliceSpec {
  std::int64_t start = 0;
  std::int64_t stop = kEnd;
  std::int64_t step = 1;
};
// One spec per leading dim (a[s0, s1, ...]); the remaining dims are kept whole.
Tensor slice(const Tensor& a, const std::vector<SliceSpec>& specs);
// a[start:start+length] along dim; unlike slice the range must lie inside the dim.
Tensor narrow(const Tensor& a, std::int64_t dim, std::int64_t start, std::int64_t length);
Tensor contiguous(const Tensor& a);  // a itself when already contiguous

// Inputs are promoted to a common dtype; shapes must match except along dim.
Tensor cat(const std::vector<Tensor>& tensors, std::int64_t dim = 0);
// Same-shape inputs along a new dim.
Tensor stack(const std::vector<Tensor>& tensors, std::int64_t dim = 0);
// Views of `split_size` along dim (the last may be shorter), or of the given sizes.
std::vector<Tensor> split(const Tensor& a, std::int64_t split_size, std::int64_t dim = 0);
std::vector<Tensor> split(const Tensor& a, const std::vector<std::int64_t>& sizes, std::int64_t dim = 0);
// At most `chunks` views of ceil(size / chunks) each, as torch.chunk.
std::vector<Tensor> chunk(const Tensor& a, std::int64_t chunks, std::int64_t dim = 0);

// out[i][j][k] = input[i][index[i][j][k]][k] for dim 1; index has input's ndim and is
// no larger than input in the other dims; out has index's shape.
Tensor gather(const Tensor& input, std::int64_t dim, const Tensor& index);
// Entries of input along dim at the 1-d index.
Tensor index_select(const Tensor& input, std::int64_t dim, const Tensor& index);
// A copy of self with out[i][index[i][j][k]][k] += src[i][j][k] for dim 1 (index no larger than src).
Tensor scatter_add(const Tensor& self, std::int64_t dim, const Tensor& index, const Tensor& src);
// i64 tensor of index's shape + [num_classes]. num_classes must be given (inferring it needs a sync).
Tensor one_hot(const Tensor& index, std::int64_t num_classes);
// Out-of-range indices: ValueError on the CPU; on a GPU they are not checked (that needs
// a sync) and read as 0 / are skipped (see kernel_templates/index.cu).

// Constant padding, PyTorch style: pads = {last_lo, last_hi, prev_lo, prev_hi, ...}, >= 0.
Tensor pad(const Tensor& a, const std::vector<std::int64_t>& pads, const Scalar& value = 0);

}  // namespace kiln
