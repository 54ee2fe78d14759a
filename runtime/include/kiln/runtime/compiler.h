#pragma once
// NVRTC: instantiated source -> PTX and, where NVRTC supports the arch, CUBIN.
#include <string>
#include <string_view>
#include <vector>

namespace kiln::rt {

struct CompileRequest {
  std::string op;      // for errors and logs
  std::string dtypes;  // "f32,f16", for errors and logs
  std::string source;  // instantiated CUDA C++
  int arch = 90;       // exact target, e.g. 90 for sm_90
  bool quick = false;  // the quick tier: quick_tier_options() too (never stored in the disk cache)
};

struct CompiledModule {
  std::string ptx;
  std::string cubin;  // empty when NVRTC cannot emit CUBIN for the arch
  double ms = 0;
};

// Throws CompileError (log, numbered source, and the file it was written to) on failure.
CompiledModule compile(const CompileRequest& req);
// Every NVRTC option `compile` passes for `arch` (part of the disk cache key). `arch_specific`
// targets sm_XXa, whose features (wgmma, setmaxnreg) run on that arch alone; ValueError when
// this NVRTC cannot emit CUBIN for it.
// `fast_compile` adds NVRTC's lightest fast-compile level (-Ofc=min, NVRTC 12.8+; nothing before).
std::vector<std::string> nvrtc_options(int arch, bool arch_specific = false, bool fast_compile = false);
// Whether `source` asks for the arch-specific target: it defines KILN_ARCH_SPECIFIC on a line
// of its own. compile() and the cache keys both read it from the source.
bool wants_arch_specific(std::string_view source);
// Whether `source` asks for fast compiles (it defines KILN_FAST_COMPILE on a line of its own) and
// KILN_FAST_COMPILE is not off (ValueError unless on or off). The elementwise, fill, index, where,
// random and im2col templates ask: their loops compile in about half the time at -Ofc=min and run
// as fast; the templates of the training steps' own kernels (norm, reduce, softmax, optimizers,
// pooling) do not, since they ran 1-6% slower built so.
bool wants_fast_compile(std::string_view source);
// What a quick-tier compile adds: NVRTC's fast-compile mode (-Ofc=mid, NVRTC 12.8+), which
// optimises less (less unrolling and inlining) for 2-3x less compile time; empty where this
// NVRTC lacks it, and then there is no quick tier.
std::vector<std::string> quick_tier_options();
std::string nvrtc_version();          // "13.0"
bool nvrtc_can_emit_cubin(int arch);  // from nvrtcGetSupportedArchs
// Directories NVRTC searches for cuda_fp16.h etc.: KILN_CUDA_INCLUDE (':'-separated),
// else the toolkit include dirs found at configure time.
std::vector<std::string> cuda_include_dirs();
// Parses "sm_90", "90", "compute_90"; throws ValueError otherwise.
int parse_arch(const std::string& text);
// Compile servers (one per compiling thread) run below this process's priority by default, so
// a run's own threads keep their cores while kernels compile beside them. A process whose work
// is compiling (jitcc warm) turns that off: on a busy machine a lowered server gets a third of
// a core's share. Applies to servers started after the call.
void set_compile_servers_lowered(bool lowered);
bool compile_servers_lowered();

}  // namespace kiln::rt
