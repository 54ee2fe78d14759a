#pragma once
// How many NVRTC compiles a process runs at once, each in its own compile server.

namespace kiln::rt {

// Past this many on one node, more compile servers made a full `jitcc warm` slower, not
// faster: on a 64-core host 6.0 s with 16 jobs against 12.7 s with 64; on a 16-core host 16
// were the best.
inline constexpr int kCompileJobsCap = 16;

// The CPUs this process may run on: its affinity mask's count (a container, taskset or batch
// scheduler may grant fewer than the host has), else the hardware threads.
int usable_cpus();

// The processes of this node sharing its compiles: LOCAL_WORLD_SIZE as kiln-run and torchrun
// set it, else 1 (also where it is not a positive number).
int ranks_on_node();

// `env` (KILN_COMPILE_JOBS's value, or null when unset) if given; else this process's share of
// the node's compiles, `cpus` capped at kCompileJobsCap and split among `ranks` processes, at
// least 1. Throws ValueError naming the variable when `env` is not a whole number from 1 to 4096.
int compile_jobs_for(const char* env, int cpus, int ranks = 1);

// KILN_COMPILE_JOBS, else compile_jobs_for(nullptr, usable_cpus(), ranks_on_node()): what
// `jitcc warm` runs.
int compile_jobs();

// Background compiles beside a run (prefetch): KILN_COMPILE_JOBS, else as compile_jobs() but
// leaving each process of the node a CPU for its run.
int background_compile_jobs();

}  // namespace kiln::rt
