// backward(): a reverse topological walk over the recorded nodes.
#include <map>
#include <mutex>
#include <queue>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "backend/cuda/grad_stream.h"
#include "core/registry.h"
#include "core/tensor/copy.h"
#include "core/tensor/tensor_impl.h"
#include "kiln/amp.h"
#include "kiln/autograd.h"
#include "kiln/runtime/kernel_plan.h"
#include "record.h"

namespace kiln {

namespace {
// Gradients meeting at a tensor add up, through the registry's add (engine/ops defines it).
Tensor add_grads(const Tensor& a, const Tensor& b) {
  static const OpDef& add = get_op("add");
  return call(add, {a, b});
}
}  // namespace

// The implicit gradient 1 of a one-element root: one constant per (device, dtype), so a
// compiled step's backward starts without a fill kernel. Only made outside a capture, where
// its value is written at once; nothing writes into it (a leaf that receives it copies it).
Tensor seed_one(const Tensor& root) {
  if (!root.device().is_cuda()) return filled(root.shape(), 1, root.dtype(), root.device());
  static std::mutex mu;
  // Never destroyed, like the cuBLAS handles: freeing device memory at exit could run after
  // the driver is gone.
  static auto* ones = new std::map<std::pair<int, DType>, Tensor>;
  std::lock_guard lock(mu);
  const auto key = std::make_pair(root.device().index(), root.dtype());
  auto it = ones->find(key);
  if (it == ones->end()) {
    // A shape-only pass writes nothing: its constant would never hold the 1.
    if (step::capturing() || rt::shape_only()) return filled(root.shape(), 1, root.dtype(), root.device());
    it = ones->emplace(key, filled(root.shape(), 1, root.dtype(), root.device())).first;
  }
  return make_view(it->second, root.shape(), contiguous_strides(root.shape()), 0);
}

class BackwardEngine {
 public:
  explicit BackwardEngine(bool retain) : retain_(retain) {}

  void seed(const Tensor& root, Tensor grad) {
    if (root.defined() && grad_enabled()) refresh_view(root);
    if (!root.requires_grad())
      throw ValueError("[backward] the tensor does not require grad: nothing it depends on has requires_grad set");
    const bool implicit = !grad.defined();
    if (implicit) {
      if (root.numel() != 1)
        throw ShapeError("[backward] a gradient must be given for a tensor of shape " + shape_str(root.shape()) +
                         "; only one-element tensors get 1 implicitly");
      grad = seed_one(root);
    }
    if (grad.shape() != root.shape() || grad.device() != root.device())
      throw ShapeError("[backward] a gradient of shape " + shape_str(grad.shape()) + " on " + grad.device().str() +
                       " for a tensor of shape " + shape_str(root.shape()) + " on " + root.device().str());
    const TensorImpl& r = *root.impl();
    if (!r.grad_fn) {
      accumulate_leaf(root.impl_ptr(), std::move(grad));
      grad_ready(root.impl_ptr());
      return;
    }
    if (add_grad(r.grad_fn.get(), r.output_nr, std::move(grad)) && implicit)
      unit_seeds_.insert({r.grad_fn.get(), r.output_nr});
    roots_.push_back(r.grad_fn);
    seeded_.insert(r.grad_fn.get());
  }

  void run() {
    count_dependencies();
    auto later_first = [](Node* a, Node* b) { return a->sequence_ < b->sequence_; };
    std::priority_queue<Node*, std::vector<Node*>, decltype(later_first)> ready(later_first);
    for (const auto& r : roots_)
      if (deps_[r.get()] == 0) ready.push(r.get());
    while (!ready.empty()) {
      Node* n = ready.top();
      ready.pop();
      if (processed_.emplace(n, true).second == false) continue;
      std::vector<Tensor> input_grads = apply(*n);
      for (std::size_t i = 0; i < n->next_.size(); ++i) {
        const Node::Edge& e = n->next_[i];
        Tensor& g = input_grads[i];
        if (e.node) {
          if (g.defined()) add_grad(e.node.get(), e.output_nr, std::move(g));
          if (--deps_[e.node.get()] == 0) ready.push(e.node.get());
        } else if (auto leaf = e.leaf.lock()) {
          if (g.defined()) {
            accumulate_leaf(leaf, std::move(g));
            reached_.insert(leaf.get());
          }
          if (--leaf_deps_[leaf.get()] == 0 && reached_.count(leaf.get())) grad_ready(leaf);
        }
      }
      if (!retain_) {
        n->saved_inputs_.clear();
        n->saved_outputs_.clear();
        n->released_ = true;
      }
      grads_.erase(n);
    }
  }

 private:
  // True when g is the slot's first gradient; a second one makes it no longer a unit seed.
  bool add_grad(Node* n, int output_nr, Tensor g) {
    auto& slots = grads_[n];
    slots.resize(n->outputs_.size());
    Tensor& slot = slots[static_cast<std::size_t>(output_nr)];
    const bool first = !slot.defined();
    if (!first) unit_seeds_.erase({n, output_nr});
    slot = first ? std::move(g) : add_grads(slot, g);
    return first;
  }

  void count_dependencies() {
    std::vector<Node*> stack;
    for (const auto& r : roots_)
      if (seen_.emplace(r.get(), true).second) stack.push_back(r.get());
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (const Node::Edge& e : n->next_) {
        if (!e.node) {
          if (auto leaf = e.leaf.lock()) ++leaf_deps_[leaf.get()];  // the paths a leaf's gradient takes
          continue;
        }
        ++deps_[e.node.get()];
        ++consumers_[e.node.get()];
        if (seen_.emplace(e.node.get(), true).second) stack.push_back(e.node.get());
      }
    }
  }

  std::vector<Tensor> apply(Node& n) {
    const std::string& name = n.name();
    if (n.released_)
      throw Error("[autograd] backward through " + name +
                  " a second time: its saved tensors were freed by the first backward; pass retain_graph=true to the "
                  "first backward to keep them");
    auto check_saved = [&](const std::vector<SavedTensor>& saved, const char* what) {
      for (std::size_t i = 0; i < saved.size(); ++i) {
        // A leaf whose gradient was final already is read again (detached): not updated early.
        if (saved[i].defined() && step::in_compiled_call())
          grad_stream::read_after(saved[i].data.impl()->storage.get());
        if (saved[i].defined() && saved[i].data.version() != saved[i].version)
          throw Error("[autograd] " + std::string(what) + " " + std::to_string(i) + " of " + name +
                      ", saved for backward, was modified in place afterwards (version " +
                      std::to_string(saved[i].data.version()) + ", saved at version " + std::to_string(saved[i].version) +
                      ")");
      }
    };
    check_saved(n.saved_inputs_, "input");
    check_saved(n.saved_outputs_, "output");

    std::vector<Tensor> grads = std::move(grads_[&n]);
    grads.resize(n.outputs_.size());
    for (std::size_t k = 0; k < grads.size(); ++k) {
      const TensorMeta& m = n.outputs_[k];
      const int first_plain = n.op_->differentiable_outputs;
      if (!grads[k].defined() && first_plain >= 0 && static_cast<int>(k) >= first_plain) continue;
      if (!grads[k].defined()) grads[k] = filled(m.shape, 0, m.dtype, m.device);
      else if (grads[k].dtype() != m.dtype &&
               !(n.op_->gradient_in_input_dtype && grads[k].dtype() == n.inputs_[0].dtype))
        grads[k] = convert(grads[k], m.dtype);
    }
    std::vector<bool> needs(n.next_.size());
    for (std::size_t i = 0; i < needs.size(); ++i) needs[i] = n.next_[i].requires_grad();
    const std::vector<Tensor> sinks = grad_sinks(n, needs);
    std::vector<bool> unit;  // only a root can have one: most nodes build nothing here
    if (!retain_ && !unit_seeds_.empty()) {
      unit.resize(n.outputs_.size());
      for (std::size_t k = 0; k < unit.size(); ++k) unit[k] = unit_seeds_.count({&n, static_cast<int>(k)}) > 0;
    }
    GradientMasks masks = gradient_masks(n, needs);
    const VjpContext context(n, needs, &sinks, &unit, &masks);
    std::vector<Tensor> out = n.op_->vjp(context, grads);
    for (std::size_t i = 0; i < masks.masked.size(); ++i)
      if (masks.masked[i]) masked_outputs_.insert(n.next_[i].node.get());
    if (out.size() != n.inputs_.size())
      throw Error("[autograd] the vjp of " + name + " returned " + std::to_string(out.size()) + " gradients for " +
                  std::to_string(n.inputs_.size()) + " inputs");
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (!needs[i] || !out[i].defined()) {
        out[i] = Tensor();
        continue;
      }
      const TensorMeta& m = n.inputs_[i];
      if (out[i].shape() != m.shape)
        throw Error("[autograd] the vjp of " + name + " returned a gradient of shape " + shape_str(out[i].shape()) +
                    " for input " + std::to_string(i) + " of shape " + shape_str(m.shape));
      // A leaf's gradient is converted by accumulate_leaf, as part of its copy into .grad().
      if (out[i].dtype() != m.dtype && n.next_[i].node && out[i].dtype() != context.grad_dtype(static_cast<int>(i)))
        out[i] = convert(out[i], m.dtype);
    }
    return out;
  }

  // Which inputs' gradients n's vjp may return ReLU-masked: output 0 of a ReLU (of one output, not
  // a root) that n reads once and nothing else on the way to the roots reads, so that this is its
  // whole gradient; and whether n's own gradient came so.
  GradientMasks gradient_masks(const Node& n, const std::vector<bool>& needs) {
    GradientMasks m;
    m.may_mask.resize(needs.size());
    m.masked.resize(needs.size());
    m.sole_producer.resize(needs.size());
    for (std::size_t i = 0; i < needs.size(); ++i) {
      const Node::Edge& e = n.next_[i];
      if (!needs[i] || !e.node || e.output_nr != 0) continue;
      const Node& p = *e.node;
      const bool sole = consumers_[&p] == 1 && seeded_.count(&p) == 0 && p.outputs_[0].dtype == n.inputs_[i].dtype;
      if (sole) m.sole_producer[i] = &p;
      m.may_mask[i] =
          sole && p.op_->relu_masked_gradient && p.outputs_.size() == 1 && p.op_->relu_masked_gradient(p.attrs_);
    }
    m.incoming.assign(n.outputs_.size(), false);
    if (!m.incoming.empty()) m.incoming[0] = masked_outputs_.count(&n) > 0;
    // Found now as they will be then: a sink's leaf is reached by that producer alone.
    m.sink_of = [this](const Node& p, int j) {
      std::vector<bool> needs(p.next_.size());
      for (std::size_t i = 0; i < needs.size(); ++i) needs[i] = p.next_[i].requires_grad();
      const std::vector<Tensor> sinks = grad_sinks(p, needs);
      return j >= 0 && static_cast<std::size_t>(j) < sinks.size() ? sinks[static_cast<std::size_t>(j)] : Tensor();
    };
    return m;
  }

  // In a compiled step, the .grad() buffers of leaf inputs whose gradient zero_grad left
  // pending: the vjp may write there directly, saving a copy per parameter per step. So too
  // for a parameter's autocast copy (OpDef::gradient_in_input_dtype) that only this input
  // reads, of a parameter reached by no other path: the buffer is written before the copy's
  // node runs, so nothing else may write it first.
  std::vector<Tensor> grad_sinks(const Node& n, const std::vector<bool>& needs) {
    std::vector<Tensor> sinks;
    if (!step::in_compiled_call()) return sinks;
    sinks.resize(needs.size());
    for (std::size_t i = 0; i < needs.size(); ++i) {
      const Node::Edge& e = n.next_[i];
      if (!needs[i]) continue;
      std::shared_ptr<TensorImpl> leaf;
      DType dtype = n.inputs_[i].dtype;
      if (e.node) {
        const Node& copy = *e.node;
        if (!copy.op_->gradient_in_input_dtype || consumers_[&copy] != 1 || copy.next_.size() != 1) continue;
        leaf = copy.next_[0].leaf.lock();
        if (!leaf || leaf_deps_[leaf.get()] != 1) continue;
        dtype = copy.inputs_[0].dtype;
      } else {
        leaf = e.leaf.lock();
      }
      if (!leaf || !leaf->grad_is_zero || !leaf->grad.defined() || !leaf->grad.is_contiguous()) continue;
      if (leaf->grad.shape() == n.inputs_[i].shape && leaf->grad.dtype() == dtype && leaf->dtype == dtype)
        sinks[i] = leaf->grad;
    }
    return sinks;
  }

  // .grad() takes g itself when nothing else can see it, else a private copy, so an
  // optimizer updating .grad() in place never writes into another tensor.
  static void accumulate_leaf(const std::shared_ptr<TensorImpl>& leaf, Tensor g) {
    if (!leaf->requires_grad) return;
    // A gradient the vjp wrote into .grad() may still be in flight on the side stream.
    if (!(leaf->grad.defined() && g.is_same(leaf->grad))) grad_stream::join();
    // g in the leaf's dtype as a new tensor: one conversion, or one copy.
    auto own_copy = [&] { return convert(g, leaf->dtype); };
    if (leaf->grad.defined()) {
      // In a compiled step the gradient keeps its storage, which the graph writes into; one
      // zeroed by zero_grad (grad_is_zero) takes a copy, converted on the way when g is of
      // another dtype (an autocast gradient).
      const bool in_place =
          step::in_compiled_call() && leaf->grad.is_contiguous() && leaf->grad.shape() == g.shape();
      if (leaf->grad_is_zero) {
        if (g.is_same(leaf->grad)) {}  // the vjp wrote into the grad sink
        else if (in_place) copy_into(g, leaf->grad);
        else leaf->grad = own_copy();
      } else {
        if (g.dtype() != leaf->dtype) g = own_copy();
        if (in_place) leaf->grad.add_(g);
        else leaf->grad = add_grads(leaf->grad, g);
      }
      leaf->grad_is_zero = false;
      return;
    }
    if (step::in_compiled_call()) {
      // A weight gradient's split sums held for the step's update (backend/cuda/split_sums.h)
      // write g, which nothing else sees: g becomes .grad() as the grad sink will in later steps,
      // so the eager call's update sums them as the captured one will.
      if (g.dtype() == leaf->dtype && g.is_contiguous() && step::holds(g)) {
        leaf->grad = std::move(g);
        return;
      }
      // The first step of a compiled function copies as later ones will, so its eager call
      // loads every kernel the capture needs.
      leaf->grad = own_copy();
      return;
    }
    const bool exclusive = g.dtype() == leaf->dtype && g.impl_ptr().use_count() == 1 &&
                           g.impl()->storage.use_count() == 1 && g.is_contiguous();
    leaf->grad = exclusive ? std::move(g) : own_copy();
  }

  // Marks the leaf's gradient final (after any pending fused work on it runs), for an
  // optimizer step that updates it before the backward ends; runs its grad-ready hooks, in
  // the order they were added. Held sums that write the gradient (a split's rows, written by
  // now) stay held where no hook reads it, for the step to make in its update; should other
  // work make them first, the leaf is marked ready again then.
  static void grad_ready(const std::shared_ptr<TensorImpl>& leaf) {
    if (step::in_compiled_call() && leaf->grad.defined() && leaf->grad.device().is_cuda()) {
      const int device = leaf->grad.device().index();
      auto mark = [leaf, device] { grad_stream::mark_ready(leaf.get(), leaf->storage.get(), device); };
      if (leaf->grad_ready_hooks.empty())
        step::before_ready(leaf->grad, mark);
      else
        step::before_use(leaf->grad);
      mark();
    }
    if (leaf->grad_ready_hooks.empty()) return;
    grad_stream::join();  // a hook may read the gradient on any stream
    const Tensor t(leaf);
    for (const auto& hook : leaf->grad_ready_hooks) hook(t);
  }

  bool retain_;
  std::unordered_map<TensorImpl*, int> leaf_deps_;
  std::unordered_set<TensorImpl*> reached_;
  std::vector<std::shared_ptr<Node>> roots_;
  std::unordered_map<Node*, std::vector<Tensor>> grads_;
  std::unordered_map<Node*, int> deps_;
  std::unordered_map<const Node*, int> consumers_;  // edges into each node (deps_ before the walk)
  std::unordered_map<Node*, bool> seen_, processed_;
  std::set<std::pair<const Node*, int>> unit_seeds_;  // outputs whose gradient is backward()'s implicit 1
  std::unordered_set<const Node*> seeded_;            // nodes a root's gradient reaches directly
  std::unordered_set<const Node*> masked_outputs_;    // ReLUs whose output 0's gradient came masked
};

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& gradients, bool retain_graph) {
  if (!gradients.empty() && gradients.size() != roots.size())
    throw ValueError("[backward] " + std::to_string(gradients.size()) + " gradients for " +
                     std::to_string(roots.size()) + " tensors");
  NoGradGuard no_grad;  // gradients of gradients are not recorded
  AutocastGuard no_autocast(std::nullopt);  // each vjp runs in the dtypes its forward op chose
  BackwardEngine engine(retain_graph);
  const grad_stream::BackwardScope side_work(
      step::in_compiled_call());  // joined when the pass ends, before the engine goes
  for (std::size_t i = 0; i < roots.size(); ++i) engine.seed(roots[i], gradients.empty() ? Tensor() : gradients[i]);
  engine.run();
}

}  // namespace kiln
