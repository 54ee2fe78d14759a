// A compiled step's weight gradients left as a split's rows (backend/cuda/split_sums.h): the
// step takes them from the step compiler before anything else, and each parameter's update sums
// its rows in the update's own kernel; where it cannot, the rows are summed first, as the weight
// gradient would have, so .grad() holds the same values either way.
#include <algorithm>
#include <exception>
#include <typeinfo>

#include "backend/cuda/split_sums.h"
#include "core/step/step_state.h"
#include "kiln/optim/optimizer.h"
#include "kiln/runtime/log.h"

namespace kiln::optim {

struct Optimizer::HeldSums {
  std::size_t index;
  step::HeldProduct product;  // its fused part: the kernels::SplitSums
  bool taken = false;         // by an update, which reads the rows: kept until the step ends
};

void Optimizer::take_held_sums(const std::vector<ParamSpan>& spans) {
  if (!takes_split_sums()) return;  // the updates' launches make them, reading the gradients
  for (const ParamSpan& s : spans) {
    const Tensor& p = params_[s.index];
    const Tensor& g = p.grad();
    if (!g.defined() || !g.device().is_cuda() || !g.is_contiguous() || s.begin != 0 || s.count != p.numel()) continue;
    std::optional<step::HeldProduct> held = step::take_sums(g);
    if (!held) continue;
    if (held->fused.type() != typeid(kernels::SplitSums)) {
      held->run();
      continue;
    }
    held_sums_.push_back(std::make_shared<HeldSums>(HeldSums{s.index, std::move(*held)}));
  }
}

void Optimizer::run_held_sums() noexcept {
  // Let go only now: an update beside the backward (update_early) reads its rows until the
  // device's stream has joined it.
  std::vector<std::shared_ptr<HeldSums>> held = std::move(held_sums_);
  held_sums_.clear();
  for (const std::shared_ptr<HeldSums>& h : held) {
    if (h->taken) continue;
    try {
      h->product.run();
    } catch (const std::exception& e) {
      rt::log().error("[{}] summing parameter {}'s gradient: {}", name(), h->index, e.what());
    }
  }
}

const kernels::SplitSums* Optimizer::take_sums_of(std::size_t index) {
  for (const std::shared_ptr<HeldSums>& h : held_sums_) {
    if (h->index != index || h->taken) continue;
    h->taken = true;
    const auto& sums = std::any_cast<const kernels::SplitSums&>(h->product.fused);
    rt::log().debug("[{}] parameter {}'s update sums its gradient's {} rows", name(), index, sums.rows);
    return &sums;
  }
  return nullptr;
}

}  // namespace kiln::optim
