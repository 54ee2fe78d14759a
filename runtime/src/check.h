#pragma once
// Checks for driver, NVRTC and cuBLAS calls: a failure throws CudaError naming
// the call, the result's name and message, and file:line.
#include "kiln/error.h"

namespace kiln::rt::detail {
[[noreturn]] void throw_cu(int result, const char* call, const char* file, int line);
[[noreturn]] void throw_nvrtc(int result, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas(int result, const char* call, const char* file, int line);
}  // namespace kiln::rt::detail

// KILN_CU(cuMemFreeAsync(p, s)) calls driver().cuMemFreeAsync(p, s).
#define KILN_CU(call)                                                                   \
  do {                                                                                  \
    auto kiln_r_ = ::kiln::rt::driver().call;                                            \
    if (kiln_r_ != CUDA_SUCCESS) ::kiln::rt::detail::throw_cu(kiln_r_, #call, __FILE__, __LINE__); \
  } while (0)

#define KILN_NVRTC(call)                                                                    \
  do {                                                                                      \
    auto kiln_r_ = (call);                                                                  \
    if (kiln_r_ != NVRTC_SUCCESS) ::kiln::rt::detail::throw_nvrtc(kiln_r_, #call, __FILE__, __LINE__); \
  } while (0)

// KILN_CUBLAS(cublasCreate(&h)) calls cublas().cublasCreate(&h) (cublas_loader.h).
#define KILN_CUBLAS(call)                                                                       \
  do {                                                                                          \
    auto kiln_r_ = ::kiln::rt::cublas().call;                                                   \
    if (kiln_r_ != CUBLAS_STATUS_SUCCESS) ::kiln::rt::detail::throw_cublas(kiln_r_, #call, __FILE__, __LINE__); \
  } while (0)
