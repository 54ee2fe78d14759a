#pragma once
// One cuBLAS handle per (device, stream), with its workspace set; created on first use.
// cuBLASLt shares that workspace (both run in stream order, so they never overlap).
#include <cstddef>

#include "memory.h"

namespace kiln::rt {
class Stream;
void* cublas_handle(const Stream& s);  // cublasHandle_t
void* cublaslt_handle(int device);     // cublasLtHandle_t, one per device

struct GemmWorkspace {
  DevicePtr ptr = 0;
  std::size_t bytes = 0;
};
GemmWorkspace cublas_workspace(const Stream& s);  // the stream's handle's workspace
}  // namespace kiln::rt
