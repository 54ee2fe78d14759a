#pragma once
// Data-parallel gradient averaging, as PyTorch's DDP does it: the parameters' gradients go in
// buckets, last layer first; when a bucket's gradients are complete in the backward, its
// all-reduce (the average over the ranks) starts on a communication stream while the backward
// goes on, and finish() makes kiln's stream wait for the buckets and leaves the averages in
// .grad(). Every piece is device work, so a kiln::compile'd step captures all of it.
//   dist::ProcessGroup group = dist::ProcessGroup::init();
//   dist::GradReducer reducer(group, net.parameters());
//   loss.backward(); reducer.finish(); opt.step();
//   loss.backward(); reducer.finish(opt);   // the same, each bucket updated once it is averaged
#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include "kiln/dist.h"
#include "kiln/tensor.h"

namespace kiln::optim {
class Optimizer;
}

namespace kiln::dist {

struct ReducerOptions {
  std::size_t bucket_bytes = std::size_t{25} << 20;  // PyTorch DDP's default bucket_cap_mb
  // The first bucket (the last layers) closes as soon as it holds this many bytes, so the first
  // all-reduce starts early in the backward (DDP's 1 MiB first bucket), or before a parameter
  // that would take it past bucket_bytes. 0, or not below bucket_bytes: the first bucket is like
  // the others.
  std::size_t first_bucket_bytes = std::size_t{1} << 20;
  // finish() leaves each .grad() as a view into its bucket (DDP's gradient_as_bucket_view), each
  // view 256-byte aligned. In a compiled step the backward then writes gradients straight into
  // the buckets: no copy in or out. A .grad() kept across steps is overwritten by the next
  // step's gradients.
  bool grad_as_bucket_view = true;
  // A bucket's all-reduce goes in pieces of at most this many bytes, so that finish(opt) updates
  // one piece's parameters (or parts of a large one) while the next piece is on the wire. 0 (the
  // default): one all-reduce per bucket. Over NVLink between two H200s pieces of 8-16 MiB made
  // the wide MLP's step 8-27% slower: NCCL moves a small all-reduce at a lower rate.
  std::size_t piece_bytes = 0;
  // bf16 or f16: f32 buckets are all-reduced in that dtype (DDP's bf16_compress_hook), halving
  // the traffic; the averaged gradients are rounded to it. Off by default.
  std::optional<DType> wire_dtype = std::nullopt;
};

// The buckets GradReducer makes for gradients of `bytes` (one dtype), in the order their
// all-reduces start: the first as described by first_bucket_bytes, then
// bucket_params(rest, bucket_bytes). ValueError when bucket_bytes is 0.
std::vector<std::vector<std::size_t>> reducer_buckets(const std::vector<std::size_t>& bytes,
                                                      const ReducerOptions& options);

class GradReducer {
 public:
  // Floating leaves that require grad, on the group's device (ValueError otherwise); adds a
  // grad-ready hook to each (Tensor::clear_grad_ready_hooks removes it). `group` and the
  // parameters must outlive the reducer. DTypeError when wire_dtype is not bf16 or f16.
  GradReducer(ProcessGroup& group, std::vector<Tensor> params, ReducerOptions options = {});
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // After backward, before the optimizer step: kiln's stream waits for every bucket's
  // all-reduce, then the averaged gradients are in .grad(). ValueError naming the
  // parameters that got no gradient in this backward (every rank must reduce every bucket).
  void finish();
  // finish() and opt.step() in one, with the parameters each piece of a bucket holds (whole or
  // in part) updated as soon as the piece's all-reduce completes, while later pieces' run
  // (Optimizer::step_in_spans): the same results as finish(); opt.step(), bit for bit. Parameters of opt outside the
  // reducer are updated last. Not for a step that looks at every gradient before updating any (a GradScaler's inf
  // check, clipping by the global norm): those call finish() first.
  void finish(optim::Optimizer& opt);

  // Parameter indices per bucket, in the order their all-reduces start.
  std::vector<std::vector<std::size_t>> buckets() const;
  // How many all-reduces each bucket goes in (ReducerOptions::piece_bytes).
  std::vector<std::size_t> pieces() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::dist
