// A compiled step's last weight gradient left as a split's rows (backend/cuda/split_sums.h):
// the step takes it from the step compiler before anything else, and the parameter's update
// sums the rows in its own kernel; where it cannot, the rows are summed first, as the weight
// gradient would have, so .grad() holds the same values either way.
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
};

void Optimizer::take_held_sums() {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor& g = params_[i].grad();
    if (!g.defined() || !g.device().is_cuda()) continue;
    std::optional<step::HeldProduct> held = step::held_for(g);
    if (!held) continue;
    if (held->ran) return;  // summed already: its update runs as any other
    if (held->fused.type() != typeid(kernels::SplitSums)) {
      held->run();
      return;
    }
    held_sums_ = std::make_shared<HeldSums>(HeldSums{i, std::move(*held)});
    return;
  }
}

void Optimizer::run_held_sums() noexcept {
  const std::shared_ptr<HeldSums> held = std::move(held_sums_);
  held_sums_.reset();
  if (!held) return;
  try {
    held->product.run();
  } catch (const std::exception& e) {
    rt::log().error("[{}] summing parameter {}'s gradient: {}", name(), held->index, e.what());
  }
}

bool Optimizer::updated_summing(const ParamSpan& s) {
  if (!held_sums_ || held_sums_->index != s.index) return false;
  const std::shared_ptr<HeldSums> held = std::move(held_sums_);
  held_sums_.reset();
  const Tensor& p = params_[s.index];
  const auto& sums = std::any_cast<const kernels::SplitSums&>(held->product.fused);
  if (s.begin == 0 && s.count == p.numel() && update_gpu_summing(s, p.grad(), sums)) {
    rt::log().debug("[{}] parameter {}'s update sums its gradient's {} rows", name(), s.index, sums.rows);
    return true;
  }
  held->product.run();
  return false;
}

}  // namespace kiln::optim
