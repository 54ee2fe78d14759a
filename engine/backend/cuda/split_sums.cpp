// The request a weight gradient's caller makes for its split's rows (split_sums.h): per thread,
// and only for run_tuned's outcome, so a measurement's candidates write the whole gradient.
#include "split_sums.h"

#include "tuner.h"

namespace kiln::kernels {

namespace {

thread_local std::optional<DeferredSums>* t_into = nullptr;

}  // namespace

DeferSplitSums::DeferSplitSums(std::optional<DeferredSums>* into) : before_(t_into) { t_into = into; }

DeferSplitSums::~DeferSplitSums() { t_into = before_; }

std::optional<DeferredSums>* deferred_sums() { return t_into && running_outcome() ? t_into : nullptr; }

}  // namespace kiln::kernels
