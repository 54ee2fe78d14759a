#pragma once
// One NVRTC compile, in this process or in a forked child. NVRTC serialises much of its work
// inside a process: 16 threads compile at a third of the rate of 16 processes on the H100
// machine. Each compiling thread gets a child that runs only NVRTC, its requests and results
// passing through pipes, so compiles in parallel scale with the cores. A fork while another thread is inside NVRTC would copy its locks held
// into the child, so the two never overlap: a process forks for every compile or for none.
#include <optional>
#include <string>
#include <vector>

namespace kiln::rt {

struct NvrtcOutput {
  bool ok = false;
  int result = 0;  // nvrtcResult of the compile
  std::string log, ptx, cubin;
};

// In this process, never beside a fork. Throws when an NVRTC call other than the compile fails.
NvrtcOutput run_nvrtc_in_process(const std::string& source, const std::string& name, const std::vector<std::string>& options,
                      bool want_cubin);

// The same in this thread's compile server (a forked child); nullopt with
// KILN_COMPILE_IN_PROCESS=1, or when no child could run it (fork failed, the child died): the
// caller then compiles in-process.
std::optional<NvrtcOutput> run_nvrtc_in_child(const std::string& source, const std::string& name,
                                              const std::vector<std::string>& options, bool want_cubin);

}  // namespace kiln::rt
