// A captured step's updates before its backward ends: the parameters whose gradients were final
// at an earlier ready point (backend/cuda/grad_stream) update on the device's third stream,
// which waits for that point only, while the backward's last kernels run; the rest follow on the
// device's stream. Each launch is the one step() makes for those parameters, so the results are
// the same bits. KILN_EARLY_UPDATES=off keeps every update after the backward.
#include <algorithm>
#include <exception>
#include <optional>

#include "backend/cuda/grad_stream.h"
#include "core/registry.h"
#include "core/step/step_state.h"
#include "kiln/optim/optimizer.h"
#include "kiln/runtime/log.h"
#include "optim_common.h"

namespace kiln::optim {

namespace {

thread_local const rt::Stream* t_update_stream = nullptr;

// Sends this thread's update launches to `s` while it lives.
struct UpdateOn {
  explicit UpdateOn(const rt::Stream* s) : before(t_update_stream) { t_update_stream = s; }
  ~UpdateOn() { t_update_stream = before; }
  UpdateOn(const UpdateOn&) = delete;
  UpdateOn& operator=(const UpdateOn&) = delete;
  const rt::Stream* before;
};

}  // namespace

namespace detail {

const rt::Stream& update_stream(Device d) {
  if (t_update_stream && t_update_stream->device() == d.index()) return *t_update_stream;
  return stream_of(d);
}

}  // namespace detail

bool Optimizer::update_early(const std::vector<ParamSpan>& spans) {
  std::optional<Device> device;
  for (const ParamSpan& s : spans) {
    const Tensor& p = params_[s.index];
    if (!p.grad().defined() || s.count == 0) continue;
    if (!p.device().is_cuda() || (device && *device != p.device())) return false;
    device = p.device();
  }
  if (!device || !step::in_compiled_call()) return false;
  // KILN_EARLY_UPDATES=off: every update after the backward, in one launch (read per capture).
  if (!rt::env_switch("KILN_EARLY_UPDATES", true, "optim")) return false;
  // The eager call makes the third stream, for its capture to find.
  if (!step::capturing()) {
    grad_stream::prepare_third(device->index());
    return false;
  }
  // Fused work still pending on a parameter or its gradient runs now, on the device's stream,
  // which then no longer stands where the backward left it: the updates wait for the backward.
  for (const ParamSpan& s : spans) {
    step::before_use(params_[s.index]);
    step::before_use(params_[s.index].grad());
  }
  const rt::Stream& main = stream_of(*device);
  std::vector<int> points;
  int last = -1;
  for (const ParamSpan& s : spans) {
    const Tensor& p = params_[s.index];
    const bool updated = p.grad().defined() && s.count != 0;
    const int point = updated ? grad_stream::ready_point(p.impl(), main) : -1;
    if (updated && point < 0) return false;
    points.push_back(point);
    last = std::max(last, point);
  }
  std::vector<ParamSpan> early, late;
  int early_point = -1;
  for (std::size_t i = 0; i < spans.size(); ++i) {
    if (points[i] >= 0 && points[i] < last) {
      early.push_back(spans[i]);
      early_point = std::max(early_point, points[i]);
    } else {
      late.push_back(spans[i]);
    }
  }
  if (early.empty()) return false;
  const rt::Stream* third = grad_stream::after_point(early_point, main);
  if (!third) return false;
  // The device's stream waits for the third before anything later, thrown out or not.
  struct Join {
    const rt::Stream& main;
    ~Join() {
      try {
        grad_stream::join_third(main);
      } catch (const std::exception& e) {
        rt::log().error("[optim] joining the early updates' stream: {}", e.what());
      }
    }
  } join{main};
  rt::log().debug("[{}] {} parameter spans updated before the backward's end (ready point {}), {} after it", name(),
                  early.size(), early_point, late.size());
  {
    const UpdateOn on(third);
    update_all(early);
  }
  update_all(late);
  return true;
}

}  // namespace kiln::optim
