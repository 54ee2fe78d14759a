// Sequential: children named by position, run in order, printed as PyTorch prints them.
#include <string>
#include <typeinfo>

#include "kiln/error.h"
#include "kiln/nn/layers.h"

namespace kiln::nn {

void Sequential::push_back(std::shared_ptr<Module> m) {
  if (!m) throw ValueError("[nn.Sequential] cannot append a null module");
  add_module(std::to_string(size()), std::move(m));
}

Module& Sequential::operator[](std::size_t i) const {
  if (i >= size())
    throw ValueError("[nn.Sequential] index " + std::to_string(i) + " is out of range for " + std::to_string(size()) +
                     " modules");
  return *children()[i].second;
}

std::shared_ptr<Module> Sequential::child(std::size_t i) const {
  (void)(*this)[i];  // the range check
  return children()[i].second;
}

void Sequential::replace(std::size_t i, std::shared_ptr<Module> m) { replace_module(i, std::move(m)); }

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  const auto& mods = children();
  for (std::size_t i = 0; i < mods.size(); ++i) {
    Module& m = *mods[i].second;
    // Linear or BatchNorm2d then ReLU (exactly those classes, not subclasses) run as one fused op,
    // as does a module whose forward_fused can.
    // typeid of a raw pointer's target: of *shared_ptr, clang warns (-Wpotentially-evaluated-expression).
    const Module* next = i + 1 < mods.size() ? mods[i + 1].second.get() : nullptr;
    const bool relu_next = next && typeid(*next) == typeid(ReLU);
    // On the GPU, BatchNorm2d, an optional ReLU and a MaxPool2d whose windows tile run as one op
    // that never stores the normalized tensor (the CPU's fast paths are the separate ops).
    const std::size_t pool_at = i + (relu_next ? 2 : 1);
    const Module* pool = pool_at < mods.size() ? mods[pool_at].second.get() : nullptr;
    if (typeid(m) == typeid(BatchNorm2d) && y.device().is_cuda() && pool && typeid(*pool) == typeid(MaxPool2d)) {
      const std::vector<std::int64_t> k = static_cast<const MaxPool2d*>(pool)->tiling_kernel();
      if (!k.empty()) {
        y = static_cast<BatchNorm2d&>(m).forward(y, relu_next ? Activation::relu : Activation::none, k);
        i = pool_at;
        continue;
      }
    }
    if (relu_next) {
      const Tensor fused = typeid(m) == typeid(Linear)        ? static_cast<Linear&>(m).forward(y, Activation::relu)
                           : typeid(m) == typeid(BatchNorm2d) ? static_cast<BatchNorm2d&>(m).forward(y, Activation::relu)
                                                              : m.forward_fused(y, Activation::relu);
      if (fused.defined()) {
        y = fused;
        ++i;
        continue;
      }
    }
    y = m.forward(y);
  }
  return y;
}

std::string Sequential::describe() const {
  if (children().empty()) return "Sequential()";
  std::string s = "Sequential(\n";
  for (const auto& [name, m] : children()) {
    // A nested container's own lines move in by one more level.
    std::string child = m->describe();
    for (std::size_t pos = child.find('\n'); pos != std::string::npos; pos = child.find('\n', pos + 3))
      child.insert(pos + 1, "  ");
    s += "  (" + name + "): " + child + "\n";
  }
  return s + ")";
}

}  // namespace kiln::nn
