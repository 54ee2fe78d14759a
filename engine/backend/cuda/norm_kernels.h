#pragma once
// Host launchers of kernel_templates/norm.cu (engine/ops/norm_batch.cpp, norm_layer.cpp). Every
// kernel takes (T, P): T the dtype of x, y and their gradients, P that of the parameters and
// running statistics (T itself, or f32 for f16/bf16 x). Statistics and scratch are in Acc: f64
// for f64 x, else f32. Addresses of absent tensors (weight, bias, running stats) are 0.
#include <cstdint>

#include "kiln/dtype.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/memory.h"

namespace kiln::kernels {

// Whether the norm kernels are instantiated for x of `t` with parameters of `p`.
bool norm_dtypes_supported(DType t, DType p);

// How a cross-block reduction splits its work: `splits` blocks per channel (batch norm) or per
// 32 columns (layer norm), each over `chunk` values or rows. The caller allocates `scratch` Acc
// elements for the blocks' partial results.
struct NormSplit {
  int splits = 1;
  std::int64_t chunk = 0;
  std::int64_t scratch = 0;
};

// x (N, C, S) contiguous; M = N * S values per channel.
struct BatchNormShape {
  std::int64_t channels = 0, spatial = 1, per_channel = 0;
  std::int64_t total() const { return channels * per_channel; }
};
NormSplit batch_norm_split(const BatchNormShape& shape, int device);

struct BatchNormForward {
  DType t = DType::f32, p = DType::f32;
  rt::DevicePtr x = 0, weight = 0, bias = 0, running_mean = 0, running_var = 0;
  rt::DevicePtr mean = 0, invstd = 0, y = 0, parts = 0;  // outputs (C, C, x's shape) and scratch
  rt::DevicePtr tracked = 0;                             // an i64 batch counter training adds one to (0: none)
  // Training: x's per-channel sums and sums of squares (2, C) in f64 from the kernel that wrote
  // x (a conv's), or 0. Given, the apply kernel makes the statistics from them (and updates the
  // running ones and the counter): no statistics kernel. Acc f32 only.
  rt::DevicePtr totals = 0;
  // Or the conv's f32 partials of those sums, (2 * C, conv_rows): the pooled kernel adds them up
  // itself, a block a channel; the plain one after a kernel that adds them into `merged` (2, C) f64.
  rt::DevicePtr conv_parts = 0, merged = 0;
  std::int64_t conv_rows = 0;
  bool training = true, relu = false;
  double momentum = 0.1, eps = 1e-5;
};
// Training: the statistics kernel (which also updates the running statistics) and the apply
// kernel; eval: the apply kernel alone, from the running statistics.
void launch_batch_norm(const BatchNormForward& a, const BatchNormShape& shape, const NormSplit& split,
                       const rt::Stream& s);

struct BatchNormBackward {
  DType t = DType::f32, p = DType::f32;
  rt::DevicePtr g = 0, x = 0, y = 0, weight = 0, mean = 0, invstd = 0;  // y: only read with relu
  rt::DevicePtr bias = 0;  // read by the pooled backward alone, which finds the outputs again
  rt::DevicePtr dx = 0, dweight = 0, dbias = 0, sums = 0, parts = 0;    // sums: 2 * C Acc scratch
  bool training = true, relu = false;
};
// The per-channel reduction (which writes dweight and dbias), then dx.
void launch_batch_norm_backward(const BatchNormBackward& a, const BatchNormShape& shape, const NormSplit& split,
                                const rt::Stream& s);

// The stages alone, for a batch norm whose statistics span several processes (dist::SyncBatchNorm):
// the statistics kernel (a.y, weight and bias unused; running statistics updated when given); the
// backward's reduction into a.sums (2, C); dx from a.sums divided by `count` values per channel.
void launch_batch_norm_stats(const BatchNormForward& a, const BatchNormShape& shape, const NormSplit& split,
                             const rt::Stream& s);
void launch_batch_norm_backward_reduce(const BatchNormBackward& a, const BatchNormShape& shape, const NormSplit& split,
                                       const rt::Stream& s);
void launch_batch_norm_backward_dx(const BatchNormBackward& a, const BatchNormShape& shape, std::int64_t count,
                                   const rt::Stream& s);

// Batch norm (and ReLU) then a max pool whose kh x kw windows tile x (N, C, H, W) contiguous:
// y (N, C, H / kh, W / kw) of a BatchNormForward is the pooled output; the full-size normalized
// tensor is never written. The backward's g is the pooled gradient, x the input again; y unused.
struct BatchNormPoolShape {
  std::int64_t n = 0, channels = 0, h = 0, w = 0, kh = 1, kw = 1;
  BatchNormShape unpooled() const { return {channels, h * w, n * h * w}; }
  std::int64_t windows_per_channel() const { return n * (h / kh) * (w / kw); }
};
// The statistics kernel as launch_batch_norm (split: batch_norm_split(shape.unpooled())), then
// one kernel that normalizes and pools.
void launch_batch_norm_max_pool(const BatchNormForward& a, const BatchNormPoolShape& shape, const NormSplit& split,
                                const rt::Stream& s);
// The backward's per-channel reduction over the windows, parked in a.parts (split.scratch Acc),
// then dx, whose blocks add up their channel's and write dweight and dbias (a.sums unused).
// 2 x 2 windows: the pooled kernels take up to four windows a thread along a row, with vector
// loads, where the shape and the pointers allow (the forward's and dx's arithmetic unchanged; the
// backward's sums in another order); off here (for tests), one window a thread.
void set_batch_norm_pool_groups(bool on);
NormSplit batch_norm_max_pool_split(const BatchNormPoolShape& shape, int device);
void launch_batch_norm_max_pool_backward(const BatchNormBackward& a, const BatchNormPoolShape& shape,
                                         const NormSplit& split, const rt::Stream& s);
// dx alone, from sums another kernel parked in a.parts (2, C * splits) as the reduction parks
// them (a conv's input gradient that wrote a.g: bn_pool_sums.h).
void launch_batch_norm_max_pool_backward_dx(const BatchNormBackward& a, const BatchNormPoolShape& shape,
                                            std::int64_t splits, const rt::Stream& s);

// Layer norm over contiguous rows x (rows, K).
void launch_layer_norm(DType t, DType p, rt::DevicePtr x, rt::DevicePtr weight, rt::DevicePtr bias, rt::DevicePtr y,
                       rt::DevicePtr mean, rt::DevicePtr invstd, std::int64_t rows, std::int64_t cols, double eps,
                       const rt::Stream& s);
NormSplit layer_norm_split(std::int64_t rows, std::int64_t cols, int device);
struct LayerNormBackward {
  DType t = DType::f32, p = DType::f32;
  rt::DevicePtr g = 0, x = 0, weight = 0, mean = 0, invstd = 0;
  rt::DevicePtr dx = 0, dweight = 0, dbias = 0, parts = 0;  // no dweight and no dbias: one kernel
};
void launch_layer_norm_backward(const LayerNormBackward& a, std::int64_t rows, std::int64_t cols,
                                const NormSplit& split, const rt::Stream& s);

// A linear layer's bias gradient db (cols, in p) = the column sums of g (rows, cols) contiguous.
// With y (the layer's ReLU output, as g), g is masked first as relu_backward does and written to
// gp: the ReLU's backward and the bias gradient in one kernel. parts: scratch of the split's size.
struct BiasGrad {
  DType t = DType::f32, p = DType::f32;
  rt::DevicePtr g = 0, y = 0, gp = 0, db = 0, parts = 0;
};
NormSplit bias_grad_split(std::int64_t rows, std::int64_t cols, int device, bool whole);
void launch_bias_grad(const BiasGrad& a, std::int64_t rows, std::int64_t cols, const NormSplit& split,
                      const rt::Stream& s);

// A narrow linear layer's dw (n, cols) = g^T x and db (n) = the column sums of g, for g (rows, n)
// and x (rows, cols), both contiguous, n at most kNarrowLinearOutputs: one kernel, its sums in a
// fixed order (norm.cu's kiln_narrow_linear_grad). With `below` (rows, cols), the layer below's
// output gradient, also its column sums into db_below: that layer's bias gradient.
constexpr std::int64_t kNarrowLinearOutputs = 16;
struct NarrowLinearGrad {
  DType t = DType::f32, p = DType::f32;
  rt::DevicePtr g = 0, x = 0, dw = 0, db = 0, below = 0, db_below = 0;
};
void launch_narrow_linear_grad(const NarrowLinearGrad& a, std::int64_t rows, std::int64_t n, std::int64_t cols,
                               const rt::Stream& s);

}  // namespace kiln::kernels
