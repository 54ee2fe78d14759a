#pragma once
// Data-parallel gradient averaging, as PyTorch's DDP does it: the parameters' gradients go in
// buckets, last layer first; when a bucket's gradients are complete in the backward, its
// all-reduce (the average over the ranks) starts on a communication stream while the backward
// goes on, and finish() makes kiln's stream wait for the buckets and writes the averages back
// into .grad(). Every piece is device work, so a kiln::compile'd step captures all of it.
//   dist::ProcessGroup group = dist::ProcessGroup::init();
//   dist::GradReducer reducer(group, net.parameters());
//   loss.backward(); reducer.finish(); opt.step();
#include <cstddef>
#include <memory>
#include <vector>

#include "kiln/dist.h"
#include "kiln/tensor.h"

namespace kiln::dist {

struct ReducerOptions {
  std::size_t bucket_bytes = std::size_t{25} << 20;  // PyTorch DDP's default bucket_cap_mb
};

class GradReducer {
 public:
  // Floating leaves that require grad, on the group's device (ValueError otherwise); adds a
  // grad-ready hook to each (Tensor::clear_grad_ready_hooks removes it). `group` and the
  // parameters must outlive the reducer.
  GradReducer(ProcessGroup& group, std::vector<Tensor> params, ReducerOptions options = {});
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // After backward, before the optimizer step: kiln's stream waits for every bucket's
  // all-reduce, then the averaged gradients go back into .grad(). ValueError naming the
  // parameters that got no gradient in this backward (every rank must reduce every bucket).
  void finish();

  // Parameter indices per bucket, in the order their all-reduces start.
  std::vector<std::vector<std::size_t>> buckets() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::dist
