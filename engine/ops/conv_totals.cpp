#include "conv_totals.h"

#include <memory>
#include <vector>

#include "core/tensor/tensor_impl.h"
#include "kiln/conv.h"

namespace kiln {

namespace {

// A conv output's totals, under its storage (held weakly: the sums go with the output).
struct Kept {
  std::weak_ptr<const void> storage;
  const void* data;
  Shape shape;
  DType dtype;
  std::uint64_t version;
  Tensor totals;
};

thread_local int t_scopes = 0;
thread_local std::vector<Kept> t_kept;

bool same(const Kept& k, const Tensor& x) {
  return k.storage.lock().get() == x.impl()->storage.get() && k.data == x.data_ptr() && k.shape == x.shape() &&
         k.dtype == x.dtype() && k.version == x.version() && x.is_contiguous();
}

}  // namespace

ConvStatsForBatchNorm::ConvStatsForBatchNorm() { ++t_scopes; }
ConvStatsForBatchNorm::~ConvStatsForBatchNorm() {
  if (--t_scopes == 0) t_kept.clear();
}

namespace conv_totals {

bool wanted() { return t_scopes > 0; }

void keep(const Tensor& y, Tensor totals) {
  t_kept.push_back({std::weak_ptr<const void>(y.impl()->storage), y.data_ptr(), y.shape(), y.dtype(), y.version(),
                    std::move(totals)});
}

Tensor take(const Tensor& x) {
  for (auto it = t_kept.begin(); it != t_kept.end(); ++it)
    if (same(*it, x)) {
      Tensor t = std::move(it->totals);
      t_kept.erase(it);
      return t;
    }
  return {};
}

}  // namespace conv_totals

}  // namespace kiln
