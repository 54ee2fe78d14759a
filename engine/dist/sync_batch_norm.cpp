// dist::SyncBatchNorm and convert_sync_batchnorm (kiln/dist/sync_batch_norm.h); the op itself is
// in sync_batch_norm_op.cpp.
#include "kiln/dist/sync_batch_norm.h"

#include <sstream>
#include <typeinfo>

#include "kiln/autograd.h"
#include "kiln/creation.h"
#include "kiln/error.h"
#include "kiln/nn_functional.h"
#include "sync_batch_norm_op.h"

namespace kiln::dist {

namespace {

constexpr const char* kWhoSyncBn = "[dist.SyncBatchNorm] ";

std::string num_str(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

}  // namespace

SyncBatchNorm::SyncBatchNorm(std::int64_t channels, ProcessGroup& group, double eps, double momentum)
    : channels_(channels),
      eps_(eps),
      momentum_(momentum),
      handle_(std::make_shared<detail::CollectivesHandle>(detail::group_collectives(group))) {
  if (channels <= 0) throw ValueError(std::string(kWhoSyncBn) + "channels must be positive; got " + std::to_string(channels));
  if (!(eps > 0.0)) throw ValueError(std::string(kWhoSyncBn) + "eps must be positive; got " + num_str(eps));
  if (!(momentum >= 0.0 && momentum <= 1.0))
    throw ValueError(std::string(kWhoSyncBn) + "momentum must be in [0, 1]; got " + num_str(momentum));
  add_parameter("weight", ones({channels}));
  add_parameter("bias", zeros({channels}));
  add_buffer("running_mean", zeros({channels}));
  add_buffer("running_var", ones({channels}));
  add_buffer("num_batches_tracked", scalar_tensor(std::int64_t{0}));
}

SyncBatchNorm::SyncBatchNorm(const nn::BatchNorm2d& bn, ProcessGroup& group)
    : channels_(bn.channels()),
      eps_(bn.eps()),
      momentum_(bn.momentum()),
      handle_(std::make_shared<detail::CollectivesHandle>(detail::group_collectives(group))) {
  for (const auto& [name, t] : bn.named_parameters()) add_parameter(name, t);
  for (const auto& [name, t] : bn.named_buffers()) add_buffer(name, t);
  train(bn.is_training());
}

Tensor SyncBatchNorm::forward(const Tensor& x) { return forward(x, Activation::none); }

Tensor SyncBatchNorm::forward(const Tensor& x, Activation activation) {
  if (!x.defined()) throw ValueError(std::string(kWhoSyncBn) + "the input is an undefined tensor");
  if (x.dim() != 4 || x.size(1) != channels_)
    throw ShapeError(std::string(kWhoSyncBn) + "expected input (N, " + std::to_string(channels_) + ", H, W), got " +
                     shape_str(x.shape()));
  if (!is_training())
    return batch_norm(x, buffer(0), buffer(1), parameter(0), parameter(1), false, momentum_, eps_, activation);
  const Device group_device = handle_->get().device();
  if (x.device() != group_device)
    throw DeviceError(std::string(kWhoSyncBn) + "the input is on " + x.device().str() + "; the process group's device is " +
                      group_device.str());
  Tensor y = detail::sync_batch_norm(x, buffer(0), buffer(1), parameter(0), parameter(1), momentum_, eps_, activation,
                                     handle_->id());
  NoGradGuard no_grad;
  Tensor tracked = buffer(2);
  tracked.add_(1);
  return y;
}

Tensor SyncBatchNorm::forward_fused(const Tensor& x, Activation activation) {
  return typeid(*this) == typeid(SyncBatchNorm) ? forward(x, activation) : Tensor();
}

std::string SyncBatchNorm::describe() const {
  return "SyncBatchNorm(" + std::to_string(channels_) + ", eps=" + num_str(eps_) + ", momentum=" + num_str(momentum_) +
         ")";
}

int convert_sync_batchnorm(nn::Sequential& net, ProcessGroup& group) {
  int replaced = 0;
  for (std::size_t i = 0; i < net.size(); ++i) {
    const std::shared_ptr<nn::Module> child = net.child(i);
    const nn::Module& module = *child;  // typeid of a plain reference: no side effects to warn about
    if (typeid(module) == typeid(nn::BatchNorm2d)) {
      net.replace(i, std::make_shared<SyncBatchNorm>(static_cast<const nn::BatchNorm2d&>(*child), group));
      ++replaced;
    } else if (auto* nested = dynamic_cast<nn::Sequential*>(child.get())) {
      replaced += convert_sync_batchnorm(*nested, group);
    }
  }
  return replaced;
}

}  // namespace kiln::dist
