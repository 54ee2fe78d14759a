#include "kiln/runtime/launch.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>

#include "check.h"
#include "driver.h"
#include "kiln/error.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/kernel_plan.h"
#include "kiln/runtime/log.h"

namespace kiln::rt {

namespace {

std::atomic<bool> g_programmatic{env_switch("KILN_PDL", true, "launch")};

// Dynamic shared memory past the default 48 KiB needs the function's opt-in first; once per
// function and size, not on every launch (modules stay loaded, so a handle names one function).
void opt_in_shared(const Function& f, unsigned bytes) {
  static std::mutex mutex;
  static std::unordered_map<void*, unsigned> opted;  // the largest size each function took
  const std::lock_guard<std::mutex> lock(mutex);
  unsigned& done = opted[f.handle];
  if (done >= bytes) return;
  KILN_CU(cuFuncSetAttribute(static_cast<CUfunction>(f.handle), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                             static_cast<int>(bytes)));
  done = bytes;
}

}  // namespace

void launch_raw(const Function& f, const LaunchConfig& c, const Stream& s, void** args) {
  if (shape_only()) return;
  if (!f.handle) throw ValueError("[launch] the function is empty (no kernel was loaded)");
  if (!s) {
    driver();  // without a GPU, say why rather than "empty"
    throw DeviceError("[launch] launch needs a stream; this one is empty");
  }
  if (s.device() != f.device) {
    throw DeviceError("[launch] a kernel loaded on cuda:" + std::to_string(f.device) +
                      " cannot run on a stream of cuda:" + std::to_string(s.device()));
  }
  make_current(f.device);
  if (c.shared_bytes > 48 * 1024) opt_in_shared(f, c.shared_bytes);
  if (f.waits_for_prior_grids && programmatic_launch()) {
    CUlaunchAttribute early{};
    early.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    early.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig lc{};
    lc.gridDimX = c.grid.x, lc.gridDimY = c.grid.y, lc.gridDimZ = c.grid.z;
    lc.blockDimX = c.block.x, lc.blockDimY = c.block.y, lc.blockDimZ = c.block.z;
    lc.sharedMemBytes = c.shared_bytes;
    lc.hStream = static_cast<CUstream>(s.handle());
    lc.attrs = &early;
    lc.numAttrs = 1;
    KILN_CU(cuLaunchKernelEx(&lc, static_cast<CUfunction>(f.handle), args, nullptr));
    return;
  }
  KILN_CU(cuLaunchKernel(static_cast<CUfunction>(f.handle), c.grid.x, c.grid.y, c.grid.z, c.block.x, c.block.y,
                         c.block.z, c.shared_bytes, static_cast<CUstream>(s.handle()), args, nullptr));
}

int resident_blocks(const Function& f, const LaunchConfig& c, int fallback) {
  if (shape_only()) return fallback;
  if (!f.handle) throw ValueError("[launch] resident_blocks: the function is empty (no kernel was loaded)");
  static std::mutex mutex;
  static std::map<std::tuple<void*, unsigned, unsigned>, int> known;
  const auto key = std::make_tuple(f.handle, c.block.x * c.block.y * c.block.z, c.shared_bytes);
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = known.find(key); it != known.end()) return it->second;
  }
  make_current(f.device);
  if (c.shared_bytes > 48 * 1024) opt_in_shared(f, c.shared_bytes);
  int blocks = 0;
  KILN_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, static_cast<CUfunction>(f.handle),
                                                      static_cast<int>(std::get<1>(key)), c.shared_bytes));
  const std::lock_guard<std::mutex> lock(mutex);
  known[key] = blocks;
  return blocks;
}

bool programmatic_launch() { return g_programmatic.load(std::memory_order_relaxed); }
void set_programmatic_launch(bool on) { g_programmatic.store(on, std::memory_order_relaxed); }

LaunchConfig linear_config(std::uint64_t n, unsigned block, unsigned max_blocks) {
  if (block == 0) throw ValueError("[launch] linear_config: block size must be positive");
  std::uint64_t blocks = n / block + (n % block != 0);
  blocks = std::clamp<std::uint64_t>(blocks, 1, std::max(max_blocks, 1u));
  LaunchConfig c;
  c.grid.x = static_cast<unsigned>(blocks);
  c.block.x = block;
  return c;
}

}  // namespace kiln::rt
