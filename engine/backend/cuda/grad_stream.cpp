#include "backend/cuda/grad_stream.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "kiln/runtime/cublas.h"
#include "kiln/runtime/graph.h"
#include "kiln/runtime/kernel_plan.h"
#include "kiln/runtime/log.h"
#include "kiln/runtime/memory.h"

namespace kiln::grad_stream {

namespace {

std::atomic<bool> g_enabled{rt::env_switch("KILN_GRAD_STREAM", true, "grad_stream")};

// A device's second stream (kSecond: weight products) or third (kThird: early updates) and the
// events of its forks and joins, made outside any capture (with its cuBLAS handle, whose
// workspace must not come from a graph's memory); kept for the process, like the device's own
// stream.
struct Side {
  rt::Stream stream;
  rt::Event forked, done;
};
constexpr int kSecond = 0, kThird = 1;

Side* side_of(int device, int which, bool make) {
  static std::mutex mu;
  static auto* sides = new std::map<std::pair<int, int>, Side>;
  std::lock_guard lock(mu);
  auto it = sides->find({device, which});
  if (it != sides->end()) return &it->second;
  if (!make) return nullptr;
  Side s{rt::Stream::create(device), rt::Event::create(device), rt::Event::create(device)};
  (void)rt::cublas_workspace(s.stream);
  return &sides->emplace(std::pair{device, which}, std::move(s)).first->second;
}

struct Pending {
  const rt::Stream* main = nullptr;
  Side* side = nullptr;
  std::vector<std::shared_ptr<const void>> kept;  // tensors' and buffers' owners, until the join
  // Capturing: the side stream takes the capture's memory, and its frees wait for the join.
  bool bound = false;
};

thread_local int t_scopes = 0;
thread_local bool t_allowed = false;
thread_local std::vector<Pending>* t_pending = nullptr;  // one entry per device with side work

// This thread's ready points in its last compiled backward: two events each (the device's
// stream, the second stream) from a pool that only grows, made by the eager call and reused by
// its capture (leaked as the streams are: a thread may end after the driver).
struct Readiness {
  int device = -1;  // -2: leaves of several devices
  int points = 0;
  std::map<const void*, int> point_of;
  std::map<const void*, const void*> leaf_of;  // ready leaves by storage
  std::vector<void*> frontier;                 // the device's stream's capture frontier when the backward ended
  std::vector<void*> last_main, last_second;   // the frontiers at the last point (while capturing)
  std::map<int, std::vector<rt::Event>>* pools = new std::map<int, std::vector<rt::Event>>;  // per device
  bool third_bound = false;
};
thread_local Readiness t_ready;

}  // namespace

bool enabled() { return g_enabled.load(std::memory_order_relaxed); }
void set_enabled(bool on) { g_enabled.store(on, std::memory_order_relaxed); }

BackwardScope::BackwardScope(bool in_compiled_call) {
  if (!in_compiled_call || !enabled() || rt::shape_only()) return;
  open_ = true;
  if (t_scopes++ > 0) return;
  t_pending = new std::vector<Pending>;
  t_ready.device = -1;
  t_ready.points = 0;
  t_ready.point_of.clear();
  t_ready.leaf_of.clear();
  t_ready.frontier.clear();
  t_ready.last_main.clear();
  t_ready.last_second.clear();
}

BackwardScope::~BackwardScope() {
  if (!open_) return;
  try {
    join();
  } catch (const std::exception& e) {
    rt::log().error("[grad_stream] joining the side stream: {}", e.what());
  }
  if (--t_scopes == 0) {
    delete t_pending;
    t_pending = nullptr;
    try {
      if (t_ready.device >= 0) t_ready.frontier = rt::capture_frontier(rt::default_stream(t_ready.device));
    } catch (const std::exception& e) {
      rt::log().error("[grad_stream] reading the capture's frontier: {}", e.what());
      t_ready.device = -2;
    }
  }
}

Allow::Allow(bool allow) : before_(t_allowed) { t_allowed = allow; }
Allow::~Allow() { t_allowed = before_; }

const rt::Stream& fork(const rt::Stream& main, std::initializer_list<Tensor> keep) {
  if (!t_pending || rt::shape_only() || !main) return main;
  // A capture may only reach streams made before it: the first, eager call of a compiled
  // function makes the side stream (its products are not yet offered grad sinks), so its
  // capture finds it.
  Side* side = side_of(main.device(), kSecond, !rt::thread_capturing());
  if (!t_allowed || !side) return main;
  Pending* p = nullptr;
  for (Pending& q : *t_pending)
    if (q.side == side) p = &q;
  if (!p) p = &t_pending->emplace_back(Pending{&main, side, {}, false});
  if (!p->bound && rt::thread_capturing())
    if (std::shared_ptr<rt::PrivatePool> pool = rt::bound_private_pool(main)) {
      rt::bind_private_pool(side->stream, std::move(pool), true);
      p->bound = true;
    }
  side->forked.record(main);
  side->stream.wait(side->forked);
  for (const Tensor& t : keep)
    if (t.defined()) p->kept.push_back(t.impl_ptr());
  return side->stream;
}

void join() {
  if (!t_pending || t_pending->empty()) return;
  std::vector<Pending> pending = std::move(*t_pending);
  t_pending->clear();
  // Every side stream gives its pool back even when a wait fails: a pool left bound would hand
  // the next capture's blocks to a stream outside it.
  std::exception_ptr failed;
  for (Pending& p : pending) {
    try {
      p.side->done.record(p.side->stream);
      p.main->wait(p.side->done);
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
    if (p.bound) rt::unbind_private_pool(p.side->stream);
  }
  if (failed) std::rethrow_exception(failed);
  // The tensors and buffers go after the waits are queued: their blocks' next use follows the
  // side work.
}

void keep(std::shared_ptr<const void> object) {
  if (t_pending && !t_pending->empty() && object) t_pending->back().kept.push_back(std::move(object));
}

void mark_ready(const void* leaf, const void* storage, int device) {
  if (!t_pending || rt::shape_only() || t_ready.device == -2) return;
  t_ready.leaf_of[storage] = leaf;
  if (t_ready.device != -1 && t_ready.device != device) {
    t_ready.device = -2;
    return;
  }
  t_ready.device = device;
  const rt::Stream& main = rt::default_stream(device);
  // With nothing forked in this backward, the device's stream stands in for the second stream,
  // whose own state is from before the call (outside a capture of it).
  Side* second = side_of(device, kSecond, false);
  const bool forked =
      second && std::any_of(t_pending->begin(), t_pending->end(), [&](const Pending& p) { return p.side == second; });
  const rt::Stream& beside = forked ? second->stream : main;
  // Leaves whose gradients one vjp finished (a layer's weight and bias) share a point: nothing
  // was queued between them.
  if (rt::thread_capturing()) {
    std::vector<void*> m = rt::capture_frontier(main), b = rt::capture_frontier(beside);
    if (t_ready.points > 0 && m == t_ready.last_main && b == t_ready.last_second) {
      t_ready.point_of[leaf] = t_ready.points - 1;
      return;
    }
    t_ready.last_main = std::move(m);
    t_ready.last_second = std::move(b);
  }
  const int point = t_ready.points++;
  std::vector<rt::Event>& events = (*t_ready.pools)[device];
  while (events.size() < 2 * static_cast<std::size_t>(point + 1)) events.push_back(rt::Event::create(device));
  events[2 * point].record(main);
  events[2 * point + 1].record(beside);
  t_ready.point_of[leaf] = point;
}

void read_after(const void* storage) {
  if (!t_pending) return;
  auto it = t_ready.leaf_of.find(storage);
  if (it != t_ready.leaf_of.end()) t_ready.point_of[it->second] = kAfterBackward;
}

int ready_point(const void* leaf, const rt::Stream& main) {
  if (!rt::thread_capturing() || t_ready.device != main.device() || t_ready.frontier.empty() ||
      rt::capture_frontier(main) != t_ready.frontier)
    return -1;
  auto it = t_ready.point_of.find(leaf);
  return it == t_ready.point_of.end() ? -1 : it->second;
}

void prepare_third(int device) {
  if (enabled() && !rt::thread_capturing() && !rt::shape_only()) (void)side_of(device, kThird, true);
}

const rt::Stream* after_point(int point, const rt::Stream& main) {
  Side* third = side_of(main.device(), kThird, false);
  if (!third || point < 0 || point >= t_ready.points) return nullptr;
  std::vector<rt::Event>& events = (*t_ready.pools)[main.device()];
  third->stream.wait(events[2 * point]);
  third->stream.wait(events[2 * point + 1]);
  if (std::shared_ptr<rt::PrivatePool> pool = rt::bound_private_pool(main)) {
    rt::bind_private_pool(third->stream, std::move(pool), true);
    t_ready.third_bound = true;
  }
  return &third->stream;
}

void join_third(const rt::Stream& main) {
  Side* third = side_of(main.device(), kThird, false);
  if (!third) return;
  third->done.record(third->stream);
  main.wait(third->done);
  if (t_ready.third_bound) rt::unbind_private_pool(third->stream);
  t_ready.third_bound = false;
}

bool beside(const void* stream, const void* main) {
  if (!t_pending || stream == main) return false;
  for (const Pending& p : *t_pending)
    if (p.side->stream.handle() == stream && p.main->handle() == main) return true;
  return false;
}

}  // namespace kiln::grad_stream
