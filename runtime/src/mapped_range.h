#pragma once
// One reserved range of a device's addresses that grows by mapping physical pages at its end
// (the driver's virtual memory management): a private pool's blocks all lie in it, so freed
// space at its end joins the next growth instead of staying behind in a chunk of its own.
#include <cuda.h>

#include <cstddef>
#include <memory>
#include <vector>

namespace kiln::rt {

class MappedRange {
 public:
  // Addresses for all of `device`'s memory, none mapped yet; null where the driver refuses
  // (virtual memory management unsupported), after a debug line saying why.
  static std::unique_ptr<MappedRange> reserve(int device);
  ~MappedRange();  // unmaps and frees the addresses; the caller has waited for their last use
  MappedRange(const MappedRange&) = delete;
  MappedRange& operator=(const MappedRange&) = delete;

  CUdeviceptr base() const { return base_; }
  std::size_t mapped() const { return mapped_; }
  std::size_t page() const { return page_; }  // growths are whole multiples of it
  // Maps `bytes` (a multiple of page()) at the end, readable and writable by the device and its
  // peers. Throws CudaError when the device is out of memory; false when the driver refuses for
  // another reason or the reserved addresses are used up, the range unchanged either way.
  bool grow(std::size_t bytes);

 private:
  MappedRange(int device, CUdeviceptr base, std::size_t reserved, std::size_t page)
      : device_(device), base_(base), reserved_(reserved), page_(page) {}

  int device_;
  CUdeviceptr base_;
  std::size_t reserved_, page_, mapped_ = 0;
  std::vector<std::size_t> pieces_;  // the size of each mapping, in order: unmapped one by one
};

}  // namespace kiln::rt
