#pragma once
// A split weight gradient whose rows are not summed yet: the f32 workspace (rows x columns,
// row-major) whose column sums (kernel_templates/row_sums.cu, blocks of kSplitSumThreads) are
// the gradient. Inside a compiled step the small conv weight-gradient kinds may hand it on
// instead of launching their reduce, so an optimizer step sums it in its update's kernel
// (kernels::set_split_sums): one launch where there were two, the same bits.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "kiln/runtime/device.h"
#include "kiln/runtime/memory.h"

namespace kiln::kernels {

inline constexpr int kSplitSumThreads = 256;

struct SplitSums {
  rt::DevicePtr ws = 0;
  std::int64_t rows = 0, columns = 0;
  int threads = 0;
  std::shared_ptr<const void> keep;  // the workspace, freed on its stream after the last use
};

// The rows, and the reduce the kind would have launched: run(s) sums them into the gradient on
// s (the stream that wrote them, or one that has waited for it).
struct DeferredSums {
  SplitSums sums;
  std::function<void(const rt::Stream&)> run;
};

// While alive, the weight-gradient kernels run as run_tuned's outcome on this thread leave their
// reduce to `*into` (nullptr: they launch it, as without the scope).
class DeferSplitSums {
 public:
  explicit DeferSplitSums(std::optional<DeferredSums>* into);
  ~DeferSplitSums();
  DeferSplitSums(const DeferSplitSums&) = delete;
  DeferSplitSums& operator=(const DeferSplitSums&) = delete;

 private:
  std::optional<DeferredSums>* before_;
};

// Where a kind that ends in a split's reduce leaves it now, or null: it launches the reduce.
std::optional<DeferredSums>* deferred_sums();

}  // namespace kiln::kernels
