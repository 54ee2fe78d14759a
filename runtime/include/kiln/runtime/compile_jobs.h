#pragma once
// How many NVRTC compiles a process runs at once, each in its own compile server.
#include <string_view>

namespace kiln::rt {

// Past this many, more compile servers made a full `jitcc warm` slower, not faster: on a
// 64-core host 6.0 s with 16 jobs against 12.7 s with 64; on a 16-core host 16 were the best.
inline constexpr int kCompileJobsCap = 16;

// The CPUs this process may run on: its affinity mask's count (a container, taskset or batch
// scheduler may grant fewer than the host has), else the hardware threads.
int usable_cpus();

// `env` (KILN_COMPILE_JOBS's value, or null when unset) if given, else `cpus` capped at
// kCompileJobsCap. Throws ValueError naming the variable when `env` is not a whole number from
// 1 to 4096.
int compile_jobs_for(const char* env, int cpus);

// KILN_COMPILE_JOBS, else the usable CPUs up to kCompileJobsCap: what `jitcc warm` runs.
int compile_jobs();

// Background compiles beside a run (prefetch): KILN_COMPILE_JOBS, else the usable CPUs but one
// (the run keeps a core) up to kCompileJobsCap; at least 1.
int background_compile_jobs();

}  // namespace kiln::rt
