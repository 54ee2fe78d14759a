#pragma once
// Several GPUs through NCCL, one process per GPU, set up the way torchrun does it:
//
//   kiln-run -n 4 -- ./train ...        (sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT,
//                                         KILN_DIST_ID_FILE for each process; --nnodes for
//                                         several machines)
//   auto pg = kiln::dist::ProcessGroup::init();       // device cuda:LOCAL_RANK
//   pg.broadcast(param, 0);                          // same start on every rank
//   pg.all_reduce(grad, kiln::dist::ReduceOp::avg);  // in place, on the device's kiln stream
//
// NCCL (libnccl.so.2) is loaded when the first group is made, never at start; see
// nccl_available(). Collectives queue work without waiting for it, and may run inside
// kiln::compile (NCCL supports CUDA graph capture). A watchdog thread per group numbers the
// collectives and, when one errs or outlives the timeout (another rank died or stopped), prints
// an error naming it, its number and the ranks it waited for, and aborts the communicator; the
// group's next call throws DeviceError. Unless InitOptions::on_failure says throw_error, it then
// ends the process (exit code kFailureExitCode) a few seconds later, as PyTorch's NCCL watchdog
// does: a thread blocked in a device synchronisation behind a spinning NCCL kernel never returns,
// and a job must fail rather than hang. The last checkpoint on disk is what survives.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "device.h"
#include "tensor.h"

namespace kiln::rt {
class Stream;
}

namespace kiln::dist {

struct Env {
  int rank = 0, world_size = 1, local_rank = 0;
  bool operator==(const Env&) const = default;
};

// RANK, WORLD_SIZE and LOCAL_RANK as torchrun and kiln-run set them; all unset: a world of 1
// (LOCAL_RANK defaults to RANK). ValueError naming the variable and its value when one is not
// an integer, is negative, or disagrees with the others (RANK >= WORLD_SIZE, ...).
Env env_from_environment();
// $KILN_DIST_TIMEOUT_S (seconds, > 0, fractions allowed), else 300 s; ValueError when malformed.
std::chrono::milliseconds timeout_from_environment();

// Whether libnccl.so.2 loads (`why` gets the reason when not), and its version ("2.27.3", or "").
bool nccl_available(std::string* why = nullptr);
std::string nccl_version();

enum class ReduceOp { sum, avg, max, min, prod };

// What a rank does once its process group failed (a collective erred or timed out).
enum class OnFailure {
  end_process,  // throw from the group's calls, and end the process kExitGrace later
  throw_error,  // only throw DeviceError from the group's calls (the process may stay blocked)
};
// The exit code of a process the watchdog ended: EX_TEMPFAIL, a failure worth retrying
// (kiln-run --max-restarts).
constexpr int kFailureExitCode = 75;
constexpr std::chrono::seconds kExitGrace{3};
// $KILN_DIST_ON_FAILURE: "exit" (the default) or "throw"; ValueError otherwise.
OnFailure on_failure_from_environment();

namespace detail {
struct GroupState;
}

struct InitOptions {
  std::optional<Env> env;                            // absent: env_from_environment()
  std::optional<Device> device;                      // absent: cuda:LOCAL_RANK
  std::optional<std::chrono::milliseconds> timeout;  // absent: timeout_from_environment()
  std::optional<OnFailure> on_failure;               // absent: on_failure_from_environment()
};

// One NCCL communicator over the world's processes, bound to one GPU. Movable, not copyable.
class ProcessGroup {
 public:
  // Rendezvous of NCCL's unique id (rank 0 makes it): through $KILN_DIST_ID_FILE when set, else
  // TCP: rank 0 listens on $MASTER_ADDR:$MASTER_PORT (a host name, IPv4 or IPv6 address; the
  // wildcard address when it is not one of this machine's) and the others connect; a world of 1
  // needs neither. Rank 0
  // removes the file once every rank joined, or when init fails. Throws DeviceError when NCCL does
  // not load, or when a rank does not show up within the timeout, at the rendezvous or in NCCL's
  // own setup (a rank that died between the two).
  static ProcessGroup init(InitOptions options = {});

  ProcessGroup();   // empty: every call throws
  ~ProcessGroup();  // destroys the communicator (after outstanding work, up to the timeout); never throws
  ProcessGroup(ProcessGroup&&) noexcept;
  ProcessGroup& operator=(ProcessGroup&&) noexcept;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int world_size() const;
  Device device() const;
  std::chrono::milliseconds timeout() const;

  // Collectives, in place as in PyTorch, queued on the kiln stream of the group's device. Tensors:
  // contiguous, on the group's device, f16/bf16/f32/f64/i32/i64/u8; otherwise DTypeError,
  // DeviceError or ValueError naming the op ("[dist.all_reduce] ..."). Every rank calls the same
  // collectives in the same order with the same shapes.
  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::sum);
  // The same on another stream of the group's device, e.g. to overlap with compute on kiln's
  // stream (GradReducer); the caller orders it against kiln's stream with events.
  void all_reduce(Tensor& t, ReduceOp op, const rt::Stream& stream);
  void broadcast(Tensor& t, int root);
  // out (any shape) holds world_size() times in's elements: rank r's copy of `in` at r * in.numel().
  void all_gather(const Tensor& in, Tensor& out);

  // The watchdog also waits for work queued on the stream so far, named `what` in its error: call
  // it after launching a compiled step, whose collectives it cannot see one by one.
  void watch(std::string_view what);
  // Throws DeviceError when the watchdog found a failure: which collective (and its number), how
  // long it waited, and for which ranks. Every collective checks first.
  void check() const;
  bool failed() const;

 private:
  void all_reduce(Tensor& t, ReduceOp op, const rt::Stream* stream);  // nullptr: kiln's stream
  std::unique_ptr<detail::GroupState> impl_;
};

// Parameter indices grouped into all-reduce buckets of at most `cap` bytes, in reverse order
// (gradients become ready roughly last layer first, as DDP assumes); greedy, and a parameter
// larger than `cap` is alone in its bucket. `bytes[i]` is parameter i's gradient size.
std::vector<std::vector<std::size_t>> bucket_params(const std::vector<std::size_t>& bytes, std::size_t cap);

// The contiguous [begin, end) slice of each global batch that `rank` trains on: the ranks'
// slices in rank order make up the batch a single-GPU run with the same seed would draw.
// ValueError unless global_batch % world == 0 (naming both), or when rank is outside [0, world).
std::pair<std::int64_t, std::int64_t> shard(std::int64_t global_batch, int rank, int world);

}  // namespace kiln::dist
