#include "backend/cuda/grad_stream.h"

#include <atomic>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "kiln/runtime/cublas.h"
#include "kiln/runtime/graph.h"
#include "kiln/runtime/kernel_plan.h"
#include "kiln/runtime/log.h"
#include "kiln/runtime/memory.h"

namespace kiln::grad_stream {

namespace {

std::atomic<bool> g_enabled{rt::env_switch("KILN_GRAD_STREAM", true, "grad_stream")};

// A device's second stream and the events of its forks and joins, made outside any capture
// (with its cuBLAS handle, whose workspace must not come from a graph's memory); kept for the
// process, like the device's own stream.
struct Side {
  rt::Stream stream;
  rt::Event forked, done;
};

Side* side_of(int device, bool make) {
  static std::mutex mu;
  static auto* sides = new std::map<int, Side>;
  std::lock_guard lock(mu);
  auto it = sides->find(device);
  if (it != sides->end()) return &it->second;
  if (!make) return nullptr;
  Side s{rt::Stream::create(device), rt::Event::create(device), rt::Event::create(device)};
  (void)rt::cublas_workspace(s.stream);
  return &sides->emplace(device, std::move(s)).first->second;
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

}  // namespace

bool enabled() { return g_enabled.load(std::memory_order_relaxed); }
void set_enabled(bool on) { g_enabled.store(on, std::memory_order_relaxed); }

BackwardScope::BackwardScope(bool in_compiled_call) {
  if (!in_compiled_call || !enabled() || rt::shape_only()) return;
  open_ = true;
  if (t_scopes++ == 0) t_pending = new std::vector<Pending>;
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
  }
}

Allow::Allow(bool allow) : before_(t_allowed) { t_allowed = allow; }
Allow::~Allow() { t_allowed = before_; }

const rt::Stream& fork(const rt::Stream& main, std::initializer_list<Tensor> keep) {
  if (!t_pending || rt::shape_only() || !main) return main;
  // A capture may only reach streams made before it: the first, eager call of a compiled
  // function makes the side stream (its products are not yet offered grad sinks), so its
  // capture finds it.
  Side* side = side_of(main.device(), !rt::thread_capturing());
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

bool beside(const void* stream, const void* main) {
  if (!t_pending || stream == main) return false;
  for (const Pending& p : *t_pending)
    if (p.side->stream.handle() == stream && p.main->handle() == main) return true;
  return false;
}

}  // namespace kiln::grad_stream
