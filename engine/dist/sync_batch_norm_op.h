#pragma once
// Internal to the engine: the op behind dist::SyncBatchNorm. An op's attrs hold only plain values,
// so the group travels as a handle (an i64 attr "group") to a registered Collectives; the node
// keeps the handle, and the vjp finds the same group for its all-reduce. Handle 0 (or no attr):
// this process alone, where the op is batch norm itself (how the registry's tests run it).
#include <cstdint>
#include <memory>

#include "kiln/device.h"
#include "kiln/linalg.h"
#include "kiln/tensor.h"

namespace kiln::dist {
class ProcessGroup;
}

namespace kiln::dist::detail {

// The two collectives the op needs. ProcessGroup's runs NCCL; tests put an in-process one
// (threads as ranks, CPU tensors) behind the same interface.
class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int world_size() const = 0;
  virtual Device device() const = 0;
  // out (world_size(), in's shape...) <- every rank's `in`, in rank order.
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  virtual void all_reduce_sum(Tensor& t) = 0;  // in place; t contiguous
};

// ProcessGroup's collectives; `group` must outlive the returned object's use.
std::shared_ptr<Collectives> group_collectives(ProcessGroup& group);

// Registers `c` under a new handle (> 0) for the life of this object.
class CollectivesHandle {
 public:
  explicit CollectivesHandle(std::shared_ptr<Collectives> c);
  ~CollectivesHandle();
  CollectivesHandle(const CollectivesHandle&) = delete;
  CollectivesHandle& operator=(const CollectivesHandle&) = delete;
  std::int64_t id() const { return id_; }
  Collectives& get() const { return *collectives_; }

 private:
  std::shared_ptr<Collectives> collectives_;
  std::int64_t id_;
};

// The registered collectives of handle `id`; ValueError naming `op` when it is gone.
std::shared_ptr<Collectives> find_collectives(std::int64_t id, const char* op);

// Batch norm in training mode with statistics over the batches of every rank of handle `group`
// (their counts may differ): running statistics updated in place (unbiased global variance), the
// backward all-reducing the per-channel gradient sums. x (N, C, d...), parameters (C) or undefined.
Tensor sync_batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, double momentum, double eps, Activation activation, std::int64_t group);

}  // namespace kiln::dist::detail
