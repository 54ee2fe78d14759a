// Sequential: children named by position, run in order, printed as PyTorch prints them.
#include <string>
#include <typeinfo>

#include "kiln/conv.h"
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

namespace {

// Runs module i of `mods` on y, with the modules after it that fuse with it, and returns the
// index of the first module it did not run.
template <class Mods>
std::size_t run_fused(const Mods& mods, std::size_t i, Tensor& y) {
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
      return pool_at + 1;
    }
  }
  if (relu_next) {
    const Tensor fused = typeid(m) == typeid(Linear)        ? static_cast<Linear&>(m).forward(y, Activation::relu)
                         : typeid(m) == typeid(BatchNorm2d) ? static_cast<BatchNorm2d&>(m).forward(y, Activation::relu)
                                                            : m.forward_fused(y, Activation::relu);
    if (fused.defined()) {
      y = fused;
      return i + 2;
    }
  }
  y = m.forward(y);
  return i + 1;
}

}  // namespace

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  const auto& mods = children();
  for (std::size_t i = 0; i < mods.size();) {
    const Module &m = *mods[i].second, *next = i + 1 < mods.size() ? mods[i + 1].second.get() : nullptr;
    // On the GPU a Conv2d without bias whose output a training BatchNorm2d reads sums its
    // channels for it, kept while the batch norm (and what fuses with it) runs.
    if (typeid(m) == typeid(Conv2d) && !static_cast<const Conv2d&>(m).bias().defined() && next &&
        typeid(*next) == typeid(BatchNorm2d) && next->is_training() && y.device().is_cuda()) {
      const ConvStatsForBatchNorm sums;
      i = run_fused(mods, run_fused(mods, i, y), y);
      continue;
    }
    i = run_fused(mods, i, y);
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
