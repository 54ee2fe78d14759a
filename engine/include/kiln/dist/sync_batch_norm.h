#pragma once
// Batch norm whose training statistics span every rank of a process group, for data-parallel
// training with small per-GPU batches (PyTorch's nn.SyncBatchNorm):
//   dist::ProcessGroup group = dist::ProcessGroup::init();
//   dist::convert_sync_batchnorm(*net, group);        // each BatchNorm2d becomes a SyncBatchNorm
//   dist::GradReducer reducer(group, net->parameters());
// In training the per-channel mean and variance are those of the global batch: the ranks'
// counts, means and variances are all-gathered (the counts may differ from rank to rank), and the
// running statistics get the unbiased global variance. The backward all-reduces the per-channel
// sums of dy and dy * xhat, so every rank's input gradient is that of the sum of all ranks'
// losses, while weight and bias get this rank's gradient for the GradReducer to average. All of
// it is device work, so a kiln::compile'd step captures it; every rank must call it in the same
// order. Eval mode is BatchNorm2d with the running statistics, without communication.
// f32/f64, and f16/bf16 inputs (autocast) with statistics in f32.
#include <cstdint>
#include <memory>
#include <string>

#include "kiln/dist.h"
#include "kiln/linalg.h"
#include "kiln/nn/layers.h"

namespace kiln::dist {

namespace detail {
class CollectivesHandle;
}

// Parameters weight, bias and buffers running_mean, running_var, num_batches_tracked, named as
// in nn::BatchNorm2d, so checkpoints of either load into the other. `group` must outlive the
// module and the graphs its forward records; it is first used by a training forward.
class SyncBatchNorm : public nn::Module {
 public:
  SyncBatchNorm(std::int64_t channels, ProcessGroup& group, double eps = 1e-5, double momentum = 0.1);
  // Takes over bn's tensors (the same handles: an optimizer over them keeps working) and mode.
  SyncBatchNorm(const nn::BatchNorm2d& bn, ProcessGroup& group);

  // x (N, C, H, W) on the group's device (ShapeError / DeviceError naming the module otherwise).
  Tensor forward(const Tensor& x) override;
  // forward, then the activation, in the same kernels.
  Tensor forward(const Tensor& x, Activation activation);
  // The same for SyncBatchNorm itself (so Sequential fuses a following ReLU), not for a subclass.
  Tensor forward_fused(const Tensor& x, Activation activation) override;
  std::string describe() const override;  // "SyncBatchNorm(32, eps=1e-05, momentum=0.1)"

 private:
  std::int64_t channels_;
  double eps_, momentum_;
  std::shared_ptr<detail::CollectivesHandle> handle_;
};

// Replaces every nn::BatchNorm2d child of `net`, and of the Sequentials nested in it, by a
// SyncBatchNorm over `group` that keeps its tensors (PyTorch's convert_sync_batchnorm). Returns how
// many were replaced.
int convert_sync_batchnorm(nn::Sequential& net, ProcessGroup& group);

}  // namespace kiln::dist
