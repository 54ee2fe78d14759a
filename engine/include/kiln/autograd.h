#pragma once
// Reverse-mode autograd over the graph of recorded ops.
//
// An op records a Node when grad mode is on and any input requires grad. The node
// keeps what its vjp needs (saved tensors, as storage aliases outside the graph) and
// what later graph passes need (op, attrs, input/output dtypes and shapes, edges).
// Ownership points from outputs to nodes to producer nodes only, so there are no cycles.
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attrs.h"
#include "tensor.h"

namespace kiln {

struct OpDef;

// Grad mode is per thread and on by default.
bool grad_enabled();
void set_grad_enabled(bool on);

class NoGradGuard {
 public:
  NoGradGuard() : prev_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

struct TensorMeta {
  DType dtype = DType::f32;
  Shape shape;
  Device device;
  bool operator==(const TensorMeta&) const = default;
};

// A tensor a node keeps for its vjp, with the storage version it had when saved.
struct SavedTensor {
  Tensor data;  // an alias with no autograd history (never the output itself: no cycle)
  std::uint64_t version = 0;
  bool defined() const { return data.defined(); }
};

class Node {
 public:
  // Where the gradient of one input goes: a producer node's output, or a leaf's .grad().
  struct Edge {
    std::shared_ptr<Node> node;     // set for a non-leaf input that requires grad
    int output_nr = 0;              // which output of `node`
    std::weak_ptr<TensorImpl> leaf;  // set for a leaf that requires grad
    bool requires_grad() const { return node != nullptr || !leaf.expired(); }
  };

  Node(const OpDef& op, Attrs attrs);
  ~Node();  // releases long producer chains iteratively (no deep recursion)
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const OpDef& op() const { return *op_; }
  const std::string& name() const;
  const Attrs& attrs() const { return attrs_; }
  const std::vector<Edge>& next_edges() const { return next_; }
  const std::vector<TensorMeta>& inputs() const { return inputs_; }
  const std::vector<TensorMeta>& outputs() const { return outputs_; }
  const std::vector<SavedTensor>& saved_inputs() const { return saved_inputs_; }   // by input index
  const std::vector<SavedTensor>& saved_outputs() const { return saved_outputs_; } // by output index
  std::uint64_t sequence() const { return sequence_; }  // creation order
  bool released() const { return released_; }

 private:
  friend struct NodeBuilder;
  friend class BackwardEngine;
  const OpDef* op_;
  Attrs attrs_;
  std::vector<Edge> next_;
  std::vector<TensorMeta> inputs_, outputs_;
  std::vector<SavedTensor> saved_inputs_, saved_outputs_;
  std::uint64_t sequence_ = 0;
  bool released_ = false;
};

// Accumulates d(sum of roots * gradients)/d(leaf) into every reachable leaf's .grad().
// A root with no gradient given must hold one element (its gradient is 1).
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& gradients = {},
              bool retain_graph = false);

}  // namespace kiln
