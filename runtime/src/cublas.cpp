#include "kiln/runtime/cublas.h"

#include <cublas_v2.h>

#include <map>
#include <mutex>
#include <utility>

#include "check.h"
#include "driver.h"
#include "kiln/error.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/memory.h"

namespace kiln::rt {

namespace {

constexpr std::size_t kWorkspaceBytes = 32u << 20;

// Handles and their workspaces are never destroyed: they live for the process, and
// destroying them at exit could run after the driver is gone.
struct Handles {
  std::mutex mu;
  std::map<std::pair<int, CUstream>, cublasHandle_t> by_stream;
};

Handles& handles() {
  static auto* h = new Handles;
  return *h;
}

cublasHandle_t create_handle(const Stream& s) {
  make_current(s.device());
  cublasHandle_t h = nullptr;
  KILN_CUBLAS(cublasCreate(&h));
  DevicePtr workspace = 0;
  try {
    KILN_CUBLAS(cublasSetStream(h, static_cast<cudaStream_t>(s.handle())));
    workspace = device_alloc(kWorkspaceBytes, s);
    KILN_CUBLAS(cublasSetWorkspace(h, reinterpret_cast<void*>(workspace), kWorkspaceBytes));
  } catch (...) {
    device_free(workspace, s);
    cublasDestroy(h);
    throw;
  }
  return h;
}

}  // namespace

void* cublas_handle(const Stream& s) {
  if (!s) {
    driver();  // without a GPU, say why rather than "empty"
    throw DeviceError("[cublas] cublas_handle needs a stream; this one is empty");
  }
  Handles& hs = handles();
  std::lock_guard lock(hs.mu);
  auto key = std::make_pair(s.device(), static_cast<CUstream>(s.handle()));
  auto it = hs.by_stream.find(key);
  if (it == hs.by_stream.end()) it = hs.by_stream.emplace(key, create_handle(s)).first;
  return it->second;
}

}  // namespace kiln::rt
