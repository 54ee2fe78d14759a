#pragma once
// NCCL, loaded from libnccl.so.2 the first time a process group needs it, so every binary builds
// and starts without NCCL. The small ABI is declared here: no nccl.h at build time (and this
// header is not named nccl.h, which CUDA 13 puts in its include directory). Internal.
#include <cstddef>
#include <string>
#include <vector>

namespace kiln::rt::nccl {

using Result = int;  // ncclResult_t
inline constexpr Result kSuccess = 0;
inline constexpr Result kInProgress = 7;  // nonblocking communicators only

struct UniqueId {
  char internal[128];
};
using Comm = struct ncclComm*;

// clang-format off
enum DataType : int {
  kInt8 = 0, kUint8 = 1, kInt32 = 2, kUint32 = 3, kInt64 = 4, kUint64 = 5,
  kFloat16 = 6, kFloat32 = 7, kFloat64 = 8, kBfloat16 = 9,
};
enum RedOp : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4 };

// X-macro list: (name, return type, parameters). cudaStream_t is a CUstream, passed as void*.
#define KILN_NCCL_FUNCTIONS(X)                                                                        \
  X(ncclGetVersion, Result, (int* version))                                                           \
  X(ncclGetUniqueId, Result, (UniqueId* id))                                                          \
  X(ncclCommInitRank, Result, (Comm* comm, int nranks, UniqueId id, int rank))                       \
  X(ncclCommDestroy, Result, (Comm comm))                                                             \
  X(ncclCommAbort, Result, (Comm comm))                                                               \
  X(ncclCommGetAsyncError, Result, (Comm comm, Result* async_error))                                  \
  X(ncclGetErrorString, const char*, (Result result))                                                 \
  X(ncclAllReduce, Result,                                                                            \
    (const void* send, void* recv, std::size_t count, DataType type, RedOp op, Comm comm, void* stream)) \
  X(ncclBroadcast, Result,                                                                            \
    (const void* send, void* recv, std::size_t count, DataType type, int root, Comm comm, void* stream)) \
  X(ncclAllGather, Result,                                                                            \
    (const void* send, void* recv, std::size_t send_count, DataType type, Comm comm, void* stream))   \
  X(ncclGroupStart, Result, ())                                                                       \
  X(ncclGroupEnd, Result, ())
// clang-format on

struct Api {
#define KILN_NCCL_DECLARE_PTR(name, ret, params) ret(*name) params = nullptr;
  KILN_NCCL_FUNCTIONS(KILN_NCCL_DECLARE_PTR)
#undef KILN_NCCL_DECLARE_PTR
};

struct Library {
  Api api;
  std::string path;  // the file that loaded
  std::string why;   // empty when usable: "[nccl] cannot load ..." otherwise
};

// Where libnccl.so.2 is looked for, in order: $KILN_NCCL_LIBRARY alone when set (an explicit
// choice that fails is an error, not a fallback); else the plain name (LD_LIBRARY_PATH,
// ld.so.cache), then the pip wheel's nvidia/nccl/lib under /usr/local, /usr and $VIRTUAL_ENV.
std::vector<std::string> library_candidates();
// Tries `candidates` in order, uncached: tests reach the failure path through it.
Library load(const std::vector<std::string>& candidates);

// The process's library, loaded from library_candidates() on first use and kept.
// api() throws DeviceError with the install hint; try_api fills `why` instead.
const Api& api();
const Api* try_api(std::string* why = nullptr);
// "2.27.3", or "" when NCCL does not load.
std::string version();

// Throws DeviceError "[nccl] <call> failed: <ncclGetErrorString>" unless r is success.
void check(Result r, const char* call);

}  // namespace kiln::rt::nccl
