#include "kiln/runtime/cublas.h"

#include <map>
#include <mutex>
#include <utility>

#include "check.h"
#include "cublas_loader.h"
#include "driver.h"
#include "kiln/error.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/memory.h"

namespace kiln::rt {

namespace {

constexpr std::size_t kWorkspaceBytes = 32u << 20;

// Handles and their workspaces are never destroyed: they live for the process, and
// destroying them at exit could run after the driver is gone.
struct StreamHandle {
  cublasHandle_t handle = nullptr;
  DevicePtr workspace = 0;
};

struct Handles {
  std::mutex mu;
  std::map<std::pair<int, CUstream>, StreamHandle> by_stream;
  std::map<int, cublasLtHandle_t> lt_by_device;
};

Handles& handles() {
  static auto* h = new Handles;
  return *h;
}

StreamHandle create_handle(const Stream& s) {
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
    cublas().cublasDestroy(h);
    throw;
  }
  return {h, workspace};
}

StreamHandle& stream_handle(const Stream& s) {
  if (!s) {
    driver();  // without a GPU, say why rather than "empty"
    throw DeviceError("[cublas] cublas_handle needs a stream; this one is empty");
  }
  Handles& hs = handles();
  std::lock_guard lock(hs.mu);
  auto key = std::make_pair(s.device(), static_cast<CUstream>(s.handle()));
  auto it = hs.by_stream.find(key);
  if (it == hs.by_stream.end()) it = hs.by_stream.emplace(key, create_handle(s)).first;
  return it->second;  // map nodes never move
}

}  // namespace

void* cublas_handle(const Stream& s) { return stream_handle(s).handle; }

GemmWorkspace cublas_workspace(const Stream& s) { return {stream_handle(s).workspace, kWorkspaceBytes}; }

void* cublaslt_handle(int device) {
  Handles& hs = handles();
  std::lock_guard lock(hs.mu);
  auto it = hs.lt_by_device.find(device);
  if (it == hs.lt_by_device.end()) {
    make_current(device);
    cublasLtHandle_t h = nullptr;
    KILN_CUBLAS(cublasLtCreate(&h));
    it = hs.lt_by_device.emplace(device, h).first;
  }
  return it->second;
}

}  // namespace kiln::rt
