#include "check.h"

#include <nvrtc.h>

#include "cublas_loader.h"
#include "driver.h"

namespace kiln::rt::detail {

void throw_cu(int result, const char* call, const char* file, int line) {
  const char* name = nullptr;
  const char* msg = nullptr;
  if (const Driver* d = try_driver(nullptr)) {
    d->cuGetErrorName(static_cast<CUresult>(result), &name);
    d->cuGetErrorString(static_cast<CUresult>(result), &msg);
  }
  throw CudaError(call, name ? name : "CUresult " + std::to_string(result), msg ? msg : "unknown error", file, line);
}

void throw_nvrtc(int result, const char* call, const char* file, int line) {
  const char* s = nvrtcGetErrorString(static_cast<nvrtcResult>(result));
  throw CudaError(call, s, "NVRTC error " + std::to_string(result), file, line);
}

void throw_cublas(int result, const char* call, const char* file, int line) {
  auto status = static_cast<cublasStatus_t>(result);
  throw CudaError(call, cublas().cublasGetStatusName(status), cublas().cublasGetStatusString(status), file, line);
}

}  // namespace kiln::rt::detail
