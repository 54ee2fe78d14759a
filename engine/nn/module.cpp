// Module bookkeeping: registration with name checks, recursive traversal with dotted
// names, device moves, train/eval and gradient reset. Lambdas inside the member
// functions reach the children's private lists, so the header needs no helpers.
#include "kiln/nn/module.h"

#include "kiln/autograd.h"
#include "kiln/error.h"

namespace kiln::nn {

namespace {

template <class Entries>
bool has_name(const Entries& entries, const std::string& name) {
  for (const auto& e : entries)
    if (e.first == name) return true;
  return false;
}

void check_tensor(const std::string& name, const Tensor& t, const char* what) {
  if (!t.defined()) throw ValueError("[nn.Module] " + std::string(what) + " '" + name + "' is an undefined tensor");
}

// One tensor on `d`, outside any graph; the same handle when already there.
Tensor moved(const Tensor& t, Device d) {
  if (t.device() == d) return t;
  NoGradGuard no_grad;
  return t.detach().to(d);
}

}  // namespace

// Parameters, buffers and children share one namespace, as dotted state-dict keys do.
static void check_name(const std::string& name, bool taken, const char* what) {
  if (name.empty()) throw ValueError(std::string("[nn.Module] ") + what + " name must not be empty");
  if (name.find('.') != std::string::npos)
    throw ValueError(std::string("[nn.Module] ") + what + " name '" + name + "' must not contain '.'");
  if (taken) throw ValueError(std::string("[nn.Module] ") + what + " name '" + name + "' is already registered");
}

std::size_t Module::add_parameter(std::string name, Tensor t) {
  check_name(name, has_name(params_, name) || has_name(buffers_, name) || has_name(children_, name), "parameter");
  check_tensor(name, t, "parameter");
  if (!is_floating(t.dtype()))
    throw DTypeError("[nn.Module] parameter '" + name + "' must be floating; got " +
                     std::string(dtype_name(t.dtype())));
  // A parameter is a leaf: a tensor produced by recorded ops is cut from its graph.
  Tensor p = t.is_leaf() ? t : t.detach();
  p.requires_grad_(true);
  params_.emplace_back(std::move(name), std::move(p));
  return params_.size() - 1;
}

std::size_t Module::add_buffer(std::string name, Tensor t) {
  check_name(name, has_name(params_, name) || has_name(buffers_, name) || has_name(children_, name), "buffer");
  check_tensor(name, t, "buffer");
  buffers_.emplace_back(std::move(name), t.requires_grad() ? t.detach() : std::move(t));
  return buffers_.size() - 1;
}

void Module::add_module(std::string name, std::shared_ptr<Module> m) {
  check_name(name, has_name(params_, name) || has_name(buffers_, name) || has_name(children_, name), "module");
  if (!m) throw ValueError("[nn.Module] module '" + name + "' is null");
  if (m.get() == this) throw ValueError("[nn.Module] module '" + name + "' cannot be its own child");
  children_.emplace_back(std::move(name), std::move(m));
}

Tensor Module::forward_fused(const Tensor&, Activation) { return Tensor(); }

void Module::replace_module(std::size_t slot, std::shared_ptr<Module> m) {
  if (slot >= children_.size())
    throw ValueError("[nn.Module] child " + std::to_string(slot) + " is out of range for " +
                     std::to_string(children_.size()) + " children");
  if (!m) throw ValueError("[nn.Module] module '" + children_[slot].first + "' is null");
  if (m.get() == this) throw ValueError("[nn.Module] module '" + children_[slot].first + "' cannot be its own child");
  children_[slot].second = std::move(m);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  auto rec = [&out](auto& self, const Module& m, const std::string& prefix) -> void {
    for (const auto& [name, t] : m.params_) out.emplace_back(prefix + name, t);
    for (const auto& [name, child] : m.children_) self(self, *child, prefix + name + ".");
  };
  rec(rec, *this, "");
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  auto rec = [&out](auto& self, const Module& m, const std::string& prefix) -> void {
    for (const auto& [name, t] : m.buffers_) out.emplace_back(prefix + name, t);
    for (const auto& [name, child] : m.children_) self(self, *child, prefix + name + ".");
  };
  rec(rec, *this, "");
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(std::move(t));
  return out;
}

NamedTensors Module::state() const {
  NamedTensors out = named_parameters();
  for (auto& entry : named_buffers()) out.push_back(std::move(entry));
  return out;
}

std::int64_t Module::parameter_count() const {
  std::int64_t n = 0;
  for (const Tensor& t : parameters()) n += t.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::to(Device d) {
  for (auto& [name, p] : params_) {
    if (p.device() == d) continue;
    const bool grad = p.requires_grad();
    Tensor np = moved(p, d);
    if (grad) np.requires_grad_(true);
    if (p.grad().defined()) np.set_grad(moved(p.grad(), d));
    p = std::move(np);
  }
  for (auto& [name, b] : buffers_) b = moved(b, d);
  for (auto& [name, child] : children_) child->to(d);
}

void Module::zero_grad() {
  for (auto& [name, p] : params_) p.zero_grad();
  for (auto& [name, child] : children_) child->zero_grad();
}

}  // namespace kiln::nn
