#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "collective_checks.h"
#include "kiln/dist.h"
#include "kiln/error.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/kernel_plan.h"
#include "kiln/runtime/log.h"
#include "nccl_loader.h"
#include "rendezvous.h"
#include "core/tensor/dispatch.h"
#include "watchdog.h"

namespace kiln::dist {

namespace nccl = rt::nccl;

struct detail::GroupState {
  Env env;
  Device device;
  std::chrono::milliseconds timeout{};
  nccl::Comm comm = nullptr;
  std::unique_ptr<detail::Watchdog> watchdog;

  ~GroupState() {
    if (!comm) return;
    try {
      const bool healthy = !watchdog || watchdog->drain();
      // A failed group's communicator is being aborted (and freed) by the watchdog. Exiting before
      // NCCL lets go of it races NCCL's teardown against the process's; an abort still stuck after
      // the grace means a kernel that never ends, so the process ends as it would have anyway.
      if (!healthy && !watchdog->wait_for_abort(kExitGrace) && watchdog->options().on_failure == OnFailure::end_process)
        detail::end_process("kiln.dist: rank " + std::to_string(env.rank) + ": ending the process (exit code " +
                            std::to_string(kFailureExitCode) + "): its failed process group's NCCL abort has not " +
                            "returned " + detail::seconds_text(kExitGrace) + " after the group was destroyed\n");
      watchdog.reset();
      if (healthy) {
        rt::make_current(device.index());
        const nccl::Result r = nccl::api().ncclCommDestroy(comm);
        if (r != nccl::kSuccess) rt::log().error("[dist] ncclCommDestroy failed (ncclResult_t {})", r);
      }
    } catch (const std::exception& e) {
      rt::log().error("[dist] destroying the process group: {}", e.what());
    }
  }

  std::string failure_text() const {
    return "the process group (rank " + std::to_string(env.rank) + " of " + std::to_string(env.world_size) +
           ") has failed: " + watchdog->failure() + ". Its NCCL communicator was aborted";
  }
};

namespace {

detail::GroupState& live(const std::unique_ptr<detail::GroupState>& impl, std::string_view op) {
  if (!impl) throw ValueError("[" + std::string(op) + "] this ProcessGroup is empty (moved from, or not made by init)");
  return *impl;
}

nccl::RedOp nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return nccl::kSum;
    case ReduceOp::avg:
      return nccl::kAvg;
    case ReduceOp::max:
      return nccl::kMax;
    case ReduceOp::min:
      return nccl::kMin;
    case ReduceOp::prod:
      return nccl::kProd;
  }
  throw ValueError("[dist.all_reduce] unknown ReduceOp " + std::to_string(static_cast<int>(op)));
}

std::string describe(std::string_view op, const Tensor& t) {
  return std::string(op) + "(" + std::string(dtype_name(t.dtype())) + shape_str(t.shape()) + ")";
}

// Queues one NCCL call on the device's kiln stream under the communicator lock, then watches it.
template <class Call>
void enqueue(detail::GroupState& g, std::string_view op, const std::string& what, Call&& call,
             const rt::Stream* on = nullptr) {
  if (rt::shape_only()) return;  // the other ranks run no such pass: nothing to meet them in
  const rt::Stream& stream = on ? *on : stream_of(g.device);
  {
    std::unique_lock lock = g.watchdog->lock_comm();
    if (!lock.owns_lock()) throw DeviceError("[" + std::string(op) + "] " + g.failure_text());
    rt::make_current(g.device.index());
    call(stream.handle());
  }
  g.watchdog->watch(what, stream);
}

// ncclCommInitRank has no timeout: a rank that died after the rendezvous would hang the others in
// it. It runs on a thread the caller stops waiting for at the deadline; a thread left behind then
// finishes (leaking its communicator) or dies with the process, which is about to report the error.
void remove_id_file(const Env& e, const detail::Rendezvous& where) {
  if (e.rank != 0 || where.file.empty()) return;
  std::error_code ec;
  std::filesystem::remove(where.file, ec);
}

nccl::Comm init_comm(const Env& e, int device, const nccl::UniqueId& id, std::chrono::milliseconds timeout) {
  struct Outcome {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    nccl::Result result = nccl::kSuccess;
    nccl::Comm comm = nullptr;
    std::string error;  // a make_current failure
  };
  auto out = std::make_shared<Outcome>();
  const nccl::Api* api = &nccl::api();
  std::thread([out, api, e, device, id] {
    nccl::Comm comm = nullptr;
    nccl::Result r = nccl::kSuccess;
    std::string error;
    try {
      rt::make_current(device);
      r = api->ncclCommInitRank(&comm, e.world_size, id, e.rank);
    } catch (const std::exception& ex) {
      error = ex.what();
    }
    const std::lock_guard lock(out->m);
    out->done = true;
    out->result = r;
    out->comm = comm;
    out->error = std::move(error);
    out->cv.notify_all();
  }).detach();
  std::unique_lock lock(out->m);
  if (!out->cv.wait_for(lock, timeout, [&] { return out->done; }))
    throw DeviceError("[dist.init] rank " + std::to_string(e.rank) + " of " + std::to_string(e.world_size) +
                      ": NCCL's communicator setup did not complete within " + detail::seconds_text(timeout) +
                      "; a rank has not joined (did every rank start, and is none of them dead?). "
                      "KILN_DIST_TIMEOUT_S sets the wait");
  if (!out->error.empty()) throw DeviceError("[dist.init] " + out->error);
  nccl::check(out->result, "ncclCommInitRank");
  return out->comm;
}

}  // namespace

bool nccl_available(std::string* why) { return nccl::try_api(why) != nullptr; }
std::string nccl_version() { return nccl::version(); }

ProcessGroup::ProcessGroup() = default;
ProcessGroup::~ProcessGroup() = default;
ProcessGroup::ProcessGroup(ProcessGroup&&) noexcept = default;
ProcessGroup& ProcessGroup::operator=(ProcessGroup&&) noexcept = default;

ProcessGroup ProcessGroup::init(InitOptions o) {
  auto g = std::make_unique<detail::GroupState>();
  g->env = o.env ? *o.env : env_from_environment();
  const Env& e = g->env;
  if (e.world_size < 1 || e.rank < 0 || e.rank >= e.world_size || e.local_rank < 0)
    throw ValueError("[dist.init] rank " + std::to_string(e.rank) + " / local rank " + std::to_string(e.local_rank) +
                     " do not fit a world of " + std::to_string(e.world_size));
  g->device = o.device ? *o.device : Device::cuda(e.local_rank);
  if (!g->device.is_cuda())
    throw DeviceError("[dist.init] a process group needs a CUDA device, not " + g->device.str());
  g->timeout = o.timeout ? *o.timeout : timeout_from_environment();
  const OnFailure on_failure = o.on_failure ? *o.on_failure : on_failure_from_environment();
  if (g->timeout.count() <= 0) throw ValueError("[dist.init] the timeout must be positive");
  const detail::Rendezvous where = detail::rendezvous_from_environment(e);

  const nccl::Api& api = nccl::api();
  rt::device_info(g->device.index());  // a DeviceError naming a missing GPU, before NCCL's
  rt::make_current(g->device.index());
  nccl::UniqueId id{};
  if (e.rank == 0) nccl::check(api.ncclGetUniqueId(&id), "ncclGetUniqueId");
  detail::IdBytes bytes{};
  std::memcpy(bytes.data(), id.internal, bytes.size());
  bytes = detail::exchange_id(where, e, bytes, g->timeout);
  std::memcpy(id.internal, bytes.data(), bytes.size());
  try {
    g->comm = init_comm(e, g->device.index(), id, g->timeout);
  } catch (...) {
    remove_id_file(e, where);
    throw;
  }
  remove_id_file(e, where);  // every rank has read it: init returns only when all joined
  g->watchdog = std::make_unique<detail::Watchdog>(g->comm, detail::WatchdogOptions{.env = e,
                                                                                    .device = g->device.index(),
                                                                                    .timeout = g->timeout,
                                                                                    .on_failure = on_failure,
                                                                                    .exit_grace = kExitGrace});
  rt::log().debug("[dist] rank {} of {} on {}: NCCL {}", e.rank, e.world_size, g->device.str(), nccl::version());
  ProcessGroup out;
  out.impl_ = std::move(g);
  return out;
}

int ProcessGroup::rank() const { return live(impl_, "dist.rank").env.rank; }
int ProcessGroup::world_size() const { return live(impl_, "dist.world_size").env.world_size; }
Device ProcessGroup::device() const { return live(impl_, "dist.device").device; }
std::chrono::milliseconds ProcessGroup::timeout() const { return live(impl_, "dist.timeout").timeout; }

bool ProcessGroup::failed() const { return impl_ && impl_->watchdog->failed(); }

void ProcessGroup::check() const {
  detail::GroupState& g = live(impl_, "dist.check");
  if (g.watchdog->failed()) throw DeviceError("[dist] " + g.failure_text());
}

void ProcessGroup::watch(std::string_view what) {
  detail::GroupState& g = live(impl_, "dist.watch");
  check();
  g.watchdog->watch(std::string(what), stream_of(g.device));
}

void ProcessGroup::all_reduce(Tensor& t, ReduceOp op) { all_reduce(t, op, nullptr); }

void ProcessGroup::all_reduce(Tensor& t, ReduceOp op, const rt::Stream& stream) {
  if (stream.device() != device().index())
    throw DeviceError("[dist.all_reduce] a stream of device " + std::to_string(stream.device()) + ", the group is on " +
                      device().str());
  all_reduce(t, op, &stream);
}

void ProcessGroup::all_reduce(Tensor& t, ReduceOp op, const rt::Stream* stream) {
  detail::GroupState& g = live(impl_, "dist.all_reduce");
  const nccl::DataType type = detail::checked_nccl_type(t, g.device, "dist.all_reduce");
  const nccl::RedOp red = nccl_op(op);
  if (t.numel() == 0) return;
  void* p = reinterpret_cast<void*>(device_address(t));
  enqueue(
      g, "dist.all_reduce", describe("all_reduce", t),
      [&](void* stream) {
        nccl::check(nccl::api().ncclAllReduce(p, p, static_cast<std::size_t>(t.numel()), type, red, g.comm, stream),
                    "ncclAllReduce");
      },
      stream);
  bump_version(t);
}

void ProcessGroup::broadcast(Tensor& t, int root) {
  detail::GroupState& g = live(impl_, "dist.broadcast");
  const nccl::DataType type = detail::checked_nccl_type(t, g.device, "dist.broadcast");
  if (root < 0 || root >= g.env.world_size)
    throw ValueError("[dist.broadcast] root " + std::to_string(root) + " is not a rank of a world of " +
                     std::to_string(g.env.world_size));
  if (t.numel() == 0) return;
  void* p = reinterpret_cast<void*>(device_address(t));
  enqueue(g, "dist.broadcast", describe("broadcast", t), [&](void* stream) {
    nccl::check(nccl::api().ncclBroadcast(p, p, static_cast<std::size_t>(t.numel()), type, root, g.comm, stream),
                "ncclBroadcast");
  });
  bump_version(t);
}

void ProcessGroup::all_gather(const Tensor& in, Tensor& out) {
  detail::GroupState& g = live(impl_, "dist.all_gather");
  const nccl::DataType type = detail::checked_nccl_type(in, g.device, "dist.all_gather");
  detail::checked_nccl_type(out, g.device, "dist.all_gather");
  if (out.dtype() != in.dtype())
    throw DTypeError("[dist.all_gather] out is " + std::string(dtype_name(out.dtype())) + ", in is " +
                     std::string(dtype_name(in.dtype())));
  if (out.numel() != in.numel() * g.env.world_size)
    throw ShapeError("[dist.all_gather] out " + shape_str(out.shape()) + " must hold world size " +
                     std::to_string(g.env.world_size) + " times in's " + std::to_string(in.numel()) + " elements");
  if (in.numel() == 0) return;
  const void* src = reinterpret_cast<const void*>(device_address(in));
  void* dst = reinterpret_cast<void*>(device_address(out));
  enqueue(g, "dist.all_gather", describe("all_gather", in), [&](void* stream) {
    nccl::check(nccl::api().ncclAllGather(src, dst, static_cast<std::size_t>(in.numel()), type, g.comm, stream),
                "ncclAllGather");
  });
  bump_version(out);
}

}  // namespace kiln::dist
