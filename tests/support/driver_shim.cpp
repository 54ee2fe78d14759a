// A stand-in libcuda.so.1 for tests on machines without a GPU: it answers the device queries as
// one sm_90 GPU of 132 SMs would, and refuses every call that needs a context (streams, memory,
// modules, launches), naming it on stderr. A process that preloads it (LD_PRELOAD, which a GPU
// host's own driver cannot come before) can only do what needs no CUDA context: a shape-only
// pass, say.
#include <cuda.h>

#include <cstdio>
#include <cstring>

#include "driver.h"

namespace {

template <class Fn>
struct Refuse;

template <class R, class... Args>
struct Refuse<R (*)(Args...)> {
  template <const char* Name>
  static R call(Args...) {
    std::fprintf(stderr, "test driver: %s refused (this driver has no CUDA context to give)\n", Name);
    return CUDA_ERROR_INVALID_CONTEXT;
  }
};

CUresult init(unsigned) {
  std::fprintf(stderr, "test driver: in use (device queries only)\n");  // tests check the stand-in was loaded
  return CUDA_SUCCESS;
}

CUresult driver_version(int* v) {
  *v = CUDA_VERSION;
  return CUDA_SUCCESS;
}

CUresult error_name(CUresult r, const char** s) {
  *s = r == CUDA_ERROR_INVALID_CONTEXT ? "CUDA_ERROR_INVALID_CONTEXT" : "CUDA_ERROR_UNKNOWN";
  return CUDA_SUCCESS;
}

CUresult error_string(CUresult r, const char** s) {
  *s = r == CUDA_ERROR_INVALID_CONTEXT ? "the test driver has no CUDA context" : "unknown error";
  return CUDA_SUCCESS;
}

CUresult device_count(int* n) {
  *n = 1;
  return CUDA_SUCCESS;
}

CUresult device_get(CUdevice* d, int ordinal) {
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *d = 0;
  return CUDA_SUCCESS;
}

CUresult device_name(char* name, int len, CUdevice) {
  std::snprintf(name, static_cast<std::size_t>(len), "kiln test driver (sm_90, no context)");
  return CUDA_SUCCESS;
}

CUresult device_attribute(int* v, CUdevice_attribute attr, CUdevice) {
  switch (attr) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      *v = 9;
      break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      *v = 0;
      break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      *v = 132;
      break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE:
      *v = 50 << 20;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
      *v = 227 << 10;
      break;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult total_memory(std::size_t* bytes, CUdevice) {
  *bytes = std::size_t{80} << 30;
  return CUDA_SUCCESS;
}

struct Entry {
  const char* name;
  void* fn;
};

// The names kiln resolves (runtime/src/driver.h), each refused unless answered above.
#define KILN_SHIM_NAME(name) constexpr char name_##name[] = #name;
KILN_DRIVER_FUNCTIONS(KILN_SHIM_NAME)
#undef KILN_SHIM_NAME

const Entry kRefused[] = {
#define KILN_SHIM_REFUSE(name) {#name, reinterpret_cast<void*>(&Refuse<decltype(&::name)>::call<name_##name>)},
    KILN_DRIVER_FUNCTIONS(KILN_SHIM_REFUSE)
#undef KILN_SHIM_REFUSE
};

const Entry kAnswered[] = {
    {"cuInit", reinterpret_cast<void*>(&init)},
    {"cuDriverGetVersion", reinterpret_cast<void*>(&driver_version)},
    {"cuGetErrorName", reinterpret_cast<void*>(&error_name)},
    {"cuGetErrorString", reinterpret_cast<void*>(&error_string)},
    {"cuDeviceGetCount", reinterpret_cast<void*>(&device_count)},
    {"cuDeviceGet", reinterpret_cast<void*>(&device_get)},
    {"cuDeviceGetName", reinterpret_cast<void*>(&device_name)},
    {"cuDeviceGetAttribute", reinterpret_cast<void*>(&device_attribute)},
    {"cuDeviceTotalMem", reinterpret_cast<void*>(&total_memory)},
};

}  // namespace

extern "C" __attribute__((visibility("default"))) CUresult cuGetProcAddress_v2(const char* symbol, void** fn, int,
                                                                               cuuint64_t,
                                                                               CUdriverProcAddressQueryResult* status) {
  *fn = nullptr;
  for (const Entry& e : kAnswered)
    if (std::strcmp(e.name, symbol) == 0) *fn = e.fn;
  for (const Entry& e : kRefused)
    if (!*fn && std::strcmp(e.name, symbol) == 0) *fn = e.fn;
  if (status) *status = *fn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return *fn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
