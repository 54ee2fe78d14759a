#include "kiln/runtime/launch.h"

#include <algorithm>
#include <string>

#include "check.h"
#include "driver.h"
#include "kiln/error.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/kernel_plan.h"

namespace kiln::rt {

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
  // Dynamic shared memory past the default 48 KiB needs the function's opt-in first.
  if (c.shared_bytes > 48 * 1024)
    KILN_CU(cuFuncSetAttribute(static_cast<CUfunction>(f.handle), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                               static_cast<int>(c.shared_bytes)));
  KILN_CU(cuLaunchKernel(static_cast<CUfunction>(f.handle), c.grid.x, c.grid.y, c.grid.z, c.block.x, c.block.y,
                         c.block.z, c.shared_bytes, static_cast<CUstream>(s.handle()), args, nullptr));
}

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
