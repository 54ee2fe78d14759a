#pragma once
// The CUDA driver API, loaded from libcuda.so.1 at run time so every binary starts
// on a machine without a driver. Internal: only runtime/src and engine sources see cuda.h.
#include <cuda.h>

#include <string>

namespace kiln::rt {

// X-macro list: (name, symbol version suffix). Pointers are resolved with cuGetProcAddress.
#define KILN_DRIVER_FUNCTIONS(X)                 \
  X(cuInit)                                      \
  X(cuDriverGetVersion)                          \
  X(cuGetErrorName)                              \
  X(cuGetErrorString)                            \
  X(cuDeviceGetCount)                            \
  X(cuDeviceGet)                                 \
  X(cuDeviceGetName)                             \
  X(cuDeviceGetAttribute)                        \
  X(cuDeviceTotalMem)                            \
  X(cuDevicePrimaryCtxRetain)                    \
  X(cuDevicePrimaryCtxRelease)                   \
  X(cuCtxSetCurrent)                             \
  X(cuCtxGetCurrent)                             \
  X(cuCtxSynchronize)                            \
  X(cuStreamCreate)                              \
  X(cuStreamCreateWithPriority)                  \
  X(cuCtxGetStreamPriorityRange)                 \
  X(cuStreamGetPriority)                         \
  X(cuStreamDestroy)                             \
  X(cuStreamSynchronize)                         \
  X(cuStreamWaitEvent)                           \
  X(cuEventCreate)                               \
  X(cuEventDestroy)                              \
  X(cuEventRecord)                               \
  X(cuEventSynchronize)                          \
  X(cuEventQuery)                                \
  X(cuEventElapsedTime)                          \
  X(cuDeviceGetDefaultMemPool)                   \
  X(cuMemPoolSetAttribute)                       \
  X(cuMemPoolGetAttribute)                       \
  X(cuMemAllocFromPoolAsync)                     \
  X(cuMemFreeAsync)                              \
  X(cuMemHostAlloc)                              \
  X(cuMemFreeHost)                               \
  X(cuMemcpyHtoDAsync)                           \
  X(cuMemcpyDtoHAsync)                           \
  X(cuMemcpyDtoDAsync)                           \
  X(cuMemsetD8Async)                             \
  X(cuMemGetInfo)                                \
  X(cuModuleLoadData)                            \
  X(cuModuleUnload)                              \
  X(cuModuleGetFunction)                         \
  X(cuModuleGetGlobal)                           \
  X(cuFuncSetAttribute)                          \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor) \
  X(cuLaunchKernel)                              \
  X(cuLaunchKernelEx)                            \
  X(cuMemAlloc)                                  \
  X(cuMemFree)                                   \
  X(cuMemAddressReserve)                         \
  X(cuMemAddressFree)                            \
  X(cuMemCreate)                                 \
  X(cuMemRelease)                                \
  X(cuMemMap)                                    \
  X(cuMemUnmap)                                  \
  X(cuMemSetAccess)                              \
  X(cuMemGetAllocationGranularity)               \
  X(cuDeviceCanAccessPeer)                       \
  X(cuThreadExchangeStreamCaptureMode)           \
  X(cuStreamBeginCapture)                        \
  X(cuStreamEndCapture)                          \
  X(cuStreamIsCapturing)                         \
  X(cuStreamGetCaptureInfo)                      \
  X(cuGraphInstantiateWithFlags)                 \
  X(cuGraphUpload)                               \
  X(cuGraphLaunch)                               \
  X(cuGraphDestroy)                              \
  X(cuGraphExecDestroy)                          \
  X(cuGraphGetNodes)                             \
  X(cuGraphGetEdges)                             \
  X(cuGraphNodeGetType)                          \
  X(cuGraphKernelNodeGetParams)                  \
  X(cuGraphExecKernelNodeSetParams)              \
  X(cuFuncGetName)                               \
  X(cuTensorMapEncodeTiled)

struct Driver {
#define KILN_DECLARE_PTR(name) decltype(&::name) name = nullptr;
  KILN_DRIVER_FUNCTIONS(KILN_DECLARE_PTR)
#undef KILN_DECLARE_PTR
};

// The loaded driver with cuInit done; throws DeviceError saying why when there is
// no libcuda.so.1, cuInit fails, or no GPU is present.
const Driver& driver();
// Same as driver() but returns nullptr and fills `why` instead of throwing.
const Driver* try_driver(std::string* why);

}  // namespace kiln::rt
