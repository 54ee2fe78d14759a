#pragma once
// The environment a kiln-nvrtc-server starts with. NVRTC's own cache (CUDA 12.9+) initialises
// the CUDA driver in every server, and the driver opens each GPU it is shown: on a 4-GPU H200
// host a server's first compile took 1.1 s longer with all four visible than with none, and
// 0.2 s longer with one. A server compiles for the arch it is given and runs nothing, so it is
// shown one device, or none when that cache is off (CUDA_CACHE_DISABLE=1).
#include <string>
#include <vector>

namespace kiln::rt {

// `parent` (a null-terminated environ) with CUDA_VISIBLE_DEVICES replaced: empty when
// CUDA_CACHE_DISABLE is 1, else the first entry of the parent's list (itself when empty), or
// 0 when the parent sets none.
std::vector<std::string> compile_server_environment(const char* const* parent);

}  // namespace kiln::rt
