// Copies of a conv's operands kept on this thread for later launches (conv_kept.h), and the scopes
// that keep them (ConvStagingReuse, ConvForBackward of conv_run.h).
#include "conv_kept.h"

#include <algorithm>
#include <vector>

#include "backend/cuda/grad_stream.h"
#include "conv_run.h"

namespace kiln::kernels {

namespace kept {

namespace {

// A forward's copies kept for its backward (ConvForBackward).
struct ForBackward {
  KeptCopy copy;
  std::weak_ptr<const void> owner;
  std::uint64_t version;
};
thread_local int t_reuse_scopes = 0;
thread_local std::vector<KeptCopy> t_kept;
thread_local std::vector<OperandScope> t_images_scopes, t_weights_scopes;
thread_local std::vector<ForBackward> t_for_backward;
constexpr std::size_t kMostForBackward = 32;  // a deep network's convs between its forward and backward

// A copy made on `kept` serves work on `now`: the same stream, or a weight gradient's second
// stream forked from it after the copy was queued (grad_stream).
bool same_stream(const void* kept, const void* now) { return kept == now || grad_stream::beside(now, kept); }

bool same_copy(const KeptCopy& k, const KeptCopy& key) {
  return k.src == key.src && k.c == key.c && k.pixels == key.pixels && k.batch == key.batch && k.t == key.t &&
         k.slices == key.slices && same_stream(k.stream, key.stream) && k.of == key.of;
}

// A copy read on another stream than its own lives until that stream's work is waited for.
std::shared_ptr<const rt::DeviceBuffer> read_on(const KeptCopy& k, const void* stream,
                                                std::shared_ptr<const rt::DeviceBuffer> copy) {
  if (copy && k.stream != stream) grad_stream::keep(copy);
  return copy;
}

// The innermost scope of `scopes` when it is for the operand at `ptr`; null otherwise.
const OperandScope* scope_for(const std::vector<OperandScope>& scopes, rt::DevicePtr ptr) {
  return !scopes.empty() && scopes.back().ptr == ptr ? &scopes.back() : nullptr;
}

}  // namespace

const OperandScope* images_scope(rt::DevicePtr ptr) { return scope_for(t_images_scopes, ptr); }
const OperandScope* weights_scope(rt::DevicePtr ptr) { return scope_for(t_weights_scopes, ptr); }

std::shared_ptr<const rt::DeviceBuffer> take_for_backward(const KeptCopy& key, const OperandScope& scope) {
  const std::shared_ptr<const void> owner = scope.owner.lock();
  for (auto it = t_for_backward.begin(); it != t_for_backward.end(); ++it)
    if (same_copy(it->copy, key) && owner && it->owner.lock() == owner && it->version == scope.version &&
        rt::is_planned(it->copy.copy->ptr()) == rt::shape_only()) {
      std::shared_ptr<const rt::DeviceBuffer> copy = read_on(it->copy, key.stream, std::move(it->copy.copy));
      t_for_backward.erase(it);
      return copy;
    }
  return nullptr;
}

void keep_for_backward(const KeptCopy& copy, const OperandScope& scope) {
  std::erase_if(t_for_backward, [&](const ForBackward& f) { return f.owner.expired() || same_copy(f.copy, copy); });
  if (t_for_backward.size() == kMostForBackward) t_for_backward.erase(t_for_backward.begin());  // the oldest
  t_for_backward.push_back({copy, scope.owner, scope.version});
}

bool reusing() { return t_reuse_scopes > 0; }

std::shared_ptr<const rt::DeviceBuffer> reused(const KeptCopy& key) {
  for (const KeptCopy& k : t_kept)
    if (same_copy(k, key)) return read_on(k, key.stream, k.copy);
  return nullptr;
}

void keep_for_reuse(const KeptCopy& copy) { t_kept.push_back(copy); }

}  // namespace kept

ConvStagingReuse::ConvStagingReuse() { ++kept::t_reuse_scopes; }
ConvStagingReuse::~ConvStagingReuse() {
  if (--kept::t_reuse_scopes == 0) kept::t_kept.clear();  // stream-ordered frees, after the launches queued
}

ConvForBackward::ConvForBackward(ConvStaged what, rt::DevicePtr operand, std::weak_ptr<const void> owner,
                                 std::uint64_t version)
    : what_(what) {
  (what == ConvStaged::images ? kept::t_images_scopes : kept::t_weights_scopes)
      .push_back({operand, std::move(owner), version});
}
ConvForBackward::~ConvForBackward() {
  (what_ == ConvStaged::images ? kept::t_images_scopes : kept::t_weights_scopes).pop_back();
}

std::size_t conv_images_kept() {
  return static_cast<std::size_t>(std::count_if(kept::t_for_backward.begin(), kept::t_for_backward.end(),
                                                [](const auto& f) { return f.copy.of == kept::CopyOf::images; }));
}
std::size_t conv_weights_kept() { return kept::t_for_backward.size() - conv_images_kept(); }

}  // namespace kiln::kernels
