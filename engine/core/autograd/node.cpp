// Grad mode, graph nodes and how op calls are recorded into them.
#include <atomic>

#include "core/registry.h"
#include "record.h"
#include "core/tensor/tensor_impl.h"

namespace kiln {

namespace {
thread_local bool t_grad_enabled = true;
std::atomic<std::uint64_t> g_sequence{0};

// An alias of t's data with no history: a node holding it never keeps a graph alive,
// and shares t's version counter so in-place writes are detected.
SavedTensor save(const Tensor& t) { return SavedTensor{make_view(t, t.shape(), t.strides(), t.offset()), t.version()}; }

TensorMeta meta(const Tensor& t) { return TensorMeta{t.dtype(), t.shape(), t.device()}; }
}  // namespace

bool grad_enabled() { return t_grad_enabled; }
void set_grad_enabled(bool on) { t_grad_enabled = on; }

Node::Node(const OpDef& op, Attrs attrs) : op_(&op), attrs_(std::move(attrs)), sequence_(g_sequence++) {}

Node::~Node() {
  // Freeing a long chain recursively would overflow the stack; unlink it iteratively.
  std::vector<std::shared_ptr<Node>> stack;
  for (Edge& e : next_)
    if (e.node) stack.push_back(std::move(e.node));
  while (!stack.empty()) {
    std::shared_ptr<Node> n = std::move(stack.back());
    stack.pop_back();
    if (n.use_count() == 1)
      for (Edge& e : n->next_)
        if (e.node) stack.push_back(std::move(e.node));
  }
}

const std::string& Node::name() const { return op_->name; }

struct NodeBuilder {
  static void record(const OpDef& op, const Attrs& attrs, std::span<const Tensor> inputs,
                     std::span<const Tensor> cast_inputs, std::span<Tensor> outputs) {
    auto node = std::make_shared<Node>(op, attrs);
    node->next_.resize(inputs.size());
    node->inputs_.reserve(inputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const TensorImpl& in = *inputs[i].impl();
      node->inputs_.push_back(meta(inputs[i]));
      if (in.grad_fn) node->next_[i] = Node::Edge{in.grad_fn, in.output_nr, {}};
      else if (in.requires_grad) node->next_[i].leaf = inputs[i].impl_ptr();
    }
    node->saved_inputs_.resize(inputs.size());
    for (int i : op.save.inputs) node->saved_inputs_.at(static_cast<std::size_t>(i)) = save(cast_inputs[i]);
    node->saved_outputs_.resize(outputs.size());
    for (int i : op.save.outputs) node->saved_outputs_.at(static_cast<std::size_t>(i)) = save(outputs[i]);
    node->outputs_.reserve(outputs.size());
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      node->outputs_.push_back(meta(outputs[k]));
      if (!is_floating(outputs[k].dtype())) continue;  // indices, masks: no gradient
      TensorImpl& out = *outputs[k].impl();
      out.grad_fn = node;
      out.output_nr = static_cast<int>(k);
      out.requires_grad = true;
    }
  }
};

bool any_requires_grad(std::span<const Tensor> inputs) {
  bool any = false;
  for (const Tensor& t : inputs) {
    if (t.defined()) refresh_view(t);  // every input, so none is recorded with a stale history
    any = any || (t.defined() && t.requires_grad());
  }
  return any;
}

void record_node(const OpDef& op, const Attrs& attrs, std::span<const Tensor> inputs,
                 std::span<const Tensor> cast_inputs, std::span<Tensor> outputs) {
  NodeBuilder::record(op, attrs, inputs, cast_inputs, outputs);
}

const Attrs& VjpContext::attrs() const { return node_.attrs(); }

void VjpContext::masked_input_gradient(int i) const {
  if (!may_mask_input_gradient(i))
    throw Error("[autograd] the vjp of " + node_.name() + " masked the gradient of input " + std::to_string(i) +
                ", which is not a ReLU's output read by it alone");
  masks_->masked[static_cast<std::size_t>(i)] = true;
}

const TensorMeta& VjpContext::input(int i) const { return node_.inputs().at(static_cast<std::size_t>(i)); }
const TensorMeta& VjpContext::output(int i) const { return node_.outputs().at(static_cast<std::size_t>(i)); }
const std::string& VjpContext::name() const { return node_.name(); }

DType VjpContext::grad_dtype(int i) const {
  const Node::Edge& e = node_.next_edges().at(static_cast<std::size_t>(i));
  if (e.node && e.node->op().gradient_in_input_dtype) return e.node->inputs().at(0).dtype;
  return input(i).dtype;
}

Tensor VjpContext::saved_input(int i) const {
  const auto& s = node_.saved_inputs();
  if (i < 0 || static_cast<std::size_t>(i) >= s.size() || !s[static_cast<std::size_t>(i)].defined())
    throw ValueError("[" + name() + "] the vjp reads input " + std::to_string(i) + ", which the save policy does not keep");
  return s[static_cast<std::size_t>(i)].data;
}

Tensor VjpContext::saved_output(int i) const {
  const auto& s = node_.saved_outputs();
  if (i < 0 || static_cast<std::size_t>(i) >= s.size() || !s[static_cast<std::size_t>(i)].defined())
    throw ValueError("[" + name() + "] the vjp reads output " + std::to_string(i) + ", which the save policy does not keep");
  return s[static_cast<std::size_t>(i)].data;
}

}  // namespace kiln
