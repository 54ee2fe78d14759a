#pragma once
// One NVRTC compile, in this process or in this thread's compile server. NVRTC serialises much
// of its work inside a process: 16 threads compile at a third of the rate of 16 processes on
// the H100 machine. Each compiling thread starts a kiln-nvrtc-server of its own (spawned and
// exec'd, never a bare fork: a forked copy of a threaded process can inherit a lock another
// thread held, its allocator's among them), so compiles in parallel scale with the cores.
#include <filesystem>
#include <optional>

#include "nvrtc_wire.h"

namespace kiln::rt {

// In this thread's compile server, else in this process. Throws CudaError when an NVRTC call
// other than the compile fails.
NvrtcOutput run_nvrtc(const NvrtcRequest& req);

// Its two halves. In this process, throwing as run_nvrtc does.
NvrtcOutput run_nvrtc_in_process(const NvrtcRequest& req);
// In this thread's server, failed_call as the server reported it; nullopt with
// KILN_COMPILE_IN_PROCESS=1, when no server is installed, or when none could run it (the spawn
// failed, the server died).
std::optional<NvrtcOutput> run_nvrtc_in_server(const NvrtcRequest& req);

// At exit: the compile servers of prefetch threads whose compiles are abandonable (loads nothing
// asked for yet) are killed, so those compiles end at once instead of holding the process until
// they finish (a later process compiles them again); a compile that then fails on such a thread
// throws. Full builds of quick ones, not abandonable, finish and are stored.
void abandon_background_compiles();
// Whether this thread's compiles from now on are abandoned at exit (prefetch threads only).
void set_compiles_abandonable(bool abandonable);

// The kiln-nvrtc-server this library starts: beside the library in a build tree, in
// <libexecdir>/kiln once installed; nullopt when neither exists.
const std::optional<std::filesystem::path>& nvrtc_server_path();

}  // namespace kiln::rt
