// MappedRange: a private pool's addresses, reserved once and mapped page by page as it grows.
#include "mapped_range.h"

#include <algorithm>

#include "check.h"
#include "driver.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/log.h"
#include "private_binding.h"

namespace kiln::rt {

namespace {

CUmemAllocationProp device_pages(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

}  // namespace

std::unique_ptr<MappedRange> MappedRange::reserve(int device) {
  const Driver& d = driver();
  const RelaxedCapture relaxed;
  const CUmemAllocationProp prop = device_pages(device);
  std::size_t granularity = 0;
  CUdevice dev = 0;
  std::size_t total = 0;
  CUdeviceptr base = 0;
  CUresult r = d.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (r == CUDA_SUCCESS) r = d.cuDeviceGet(&dev, device);
  if (r == CUDA_SUCCESS) r = d.cuDeviceTotalMem(&total, dev);
  const std::size_t page = std::max<std::size_t>(granularity, std::size_t{2} << 20);
  const std::size_t reserved = (total + page - 1) / page * page;
  if (r == CUDA_SUCCESS) r = d.cuMemAddressReserve(&base, reserved, page, 0, 0);
  if (r != CUDA_SUCCESS) {
    const char* name = nullptr;
    d.cuGetErrorName(r, &name);
    log().debug("[memory] private pools on cuda:{} take cuMemAlloc chunks: reserving addresses failed ({})", device,
                name ? name : "?");
    return nullptr;
  }
  return std::unique_ptr<MappedRange>(new MappedRange(device, base, reserved, page));
}

MappedRange::~MappedRange() {
  const Driver& d = driver();
  std::size_t at = 0;
  for (std::size_t bytes : pieces_) {
    if (d.cuMemUnmap(base_ + at, bytes) != CUDA_SUCCESS)
      log().error("[memory] unmapping {} bytes of a private pool on cuda:{} failed", bytes, device_);
    at += bytes;
  }
  if (d.cuMemAddressFree(base_, reserved_) != CUDA_SUCCESS)
    log().error("[memory] freeing a private pool's addresses on cuda:{} failed", device_);
}

bool MappedRange::grow(std::size_t bytes) {
  if (bytes == 0 || bytes % page_ != 0 || mapped_ + bytes > reserved_) return false;
  const Driver& d = driver();
  const RelaxedCapture relaxed;
  const CUmemAllocationProp prop = device_pages(device_);
  CUmemGenericAllocationHandle pages = 0;
  CUresult r = d.cuMemCreate(&pages, bytes, &prop, 0);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) detail::throw_cu(r, "cuMemCreate for a private pool", __FILE__, __LINE__);
  if (r != CUDA_SUCCESS) return false;
  const CUdeviceptr at = base_ + mapped_;
  r = d.cuMemMap(at, bytes, 0, pages, 0);
  d.cuMemRelease(pages);  // the mapping keeps the pages until it goes
  if (r != CUDA_SUCCESS) return false;
  // Readable and writable by the device and by every peer that can reach it (a collective may
  // read a peer's buffer directly).
  std::vector<CUmemAccessDesc> access;
  for (int peer = 0; peer < device_count(); ++peer) {
    int can = peer == device_;
    CUdevice a = 0, b = 0;
    if (!can && d.cuDeviceGet(&a, peer) == CUDA_SUCCESS && d.cuDeviceGet(&b, device_) == CUDA_SUCCESS)
      d.cuDeviceCanAccessPeer(&can, a, b);
    if (can) access.push_back({{CU_MEM_LOCATION_TYPE_DEVICE, peer}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE});
  }
  r = d.cuMemSetAccess(at, bytes, access.data(), access.size());
  if (r != CUDA_SUCCESS && access.size() > 1) {  // the device's own access, at least
    const CUmemAccessDesc own{{CU_MEM_LOCATION_TYPE_DEVICE, device_}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    r = d.cuMemSetAccess(at, bytes, &own, 1);
  }
  if (r != CUDA_SUCCESS) {
    d.cuMemUnmap(at, bytes);
    return false;
  }
  pieces_.push_back(bytes);
  mapped_ += bytes;
  return true;
}

}  // namespace kiln::rt
