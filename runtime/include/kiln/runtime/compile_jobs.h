#pragma once
// How many NVRTC compiles a process runs at once, each in its own compile server.
#include <cstddef>

namespace kiln::rt {

// Past this many on one node, more compile servers made a full `jitcc warm` little faster or
// slower: on the 64-core 4-GPU H200 host 10.6 s cold with 16 jobs, 8.9 with 32, 10.6 with 64,
// and with NVRTC's cache answering 2.5, 4.0 and 7.8 s (2.2 with 8); on a 16-core host 16 were
// the best.
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

// A run's plan gets a compile server per this many kernels at most. Each server's first compile
// pays its start, and servers starting together slow each other, but since servers no longer
// open every GPU (server_environment.h) more of them win: on the 16-core H200 host a cold cnn
// (44 kernels) ran 2.76-2.86 s with 6 servers, 2.41-2.58 with 8 and 2.04-2.20 with 12 or 15;
// a cold mlp (24) 1.90-2.08 s with 4 and 1.44-1.70 with 12 or 15.
inline constexpr int kKernelsPerServer = 2;

// `env` (KILN_COMPILE_JOBS) if given, else `background` but at most a server per
// kKernelsPerServer of the `kernels` to compile, at least 1. ValueError as compile_jobs_for.
int prefetch_jobs_for(const char* env, int background, std::size_t kernels);

// prefetch_jobs_for(KILN_COMPILE_JOBS, background_compile_jobs(), kernels): a run's prefetch.
int prefetch_jobs(std::size_t kernels);

}  // namespace kiln::rt
