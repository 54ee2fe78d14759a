#include "step_state.h"

#include <string>

#include "kiln/error.h"

namespace kiln::step {

std::atomic<int> g_captures{0};
std::atomic<int> g_fusions{0};
thread_local bool t_capturing = false;
thread_local int t_compiled_calls = 0;

namespace {
StepCompiler* g_compiler = nullptr;
}

void install(StepCompiler& c) { g_compiler = &c; }

StepCompiler& compiler() {
  if (!g_compiler) throw Error("[step] no step compiler is installed (engine/compile did not load)");
  return *g_compiler;
}

void require_host(const char* op, const char* what) {
  if (!t_capturing) return;
  throw ValueError("[" + std::string(op) + "] " + what +
                   " needs the host, which a captured step cannot do: a CUDA graph replays device work only. "
                   "Move it out of the compiled function (or read the returned tensors after the call)");
}

}  // namespace kiln::step
