#pragma once
// Where a tensor lives: the host, or one CUDA device by ordinal.
#include <ostream>
#include <string>
#include <string_view>

namespace kiln {

class Device {
 public:
  enum class Kind : unsigned char { cpu, cuda };

  constexpr Device() = default;  // cpu
  static constexpr Device cpu() { return Device(Kind::cpu, 0); }
  static Device cuda(int ordinal = 0);  // throws DeviceError for a negative ordinal
  // "cpu", "cuda", "cuda:1"; throws DeviceError otherwise. Does not check that the GPU exists.
  static Device parse(std::string_view text);

  Kind kind() const { return kind_; }
  int index() const { return index_; }
  bool is_cpu() const { return kind_ == Kind::cpu; }
  bool is_cuda() const { return kind_ == Kind::cuda; }
  std::string str() const;  // "cpu", "cuda:0"

  bool operator==(const Device& o) const = default;

 private:
  constexpr Device(Kind k, int i) : kind_(k), index_(i) {}
  Kind kind_ = Kind::cpu;
  int index_ = 0;
};

std::ostream& operator<<(std::ostream& os, const Device& d);

// GPUs kiln can use: 0 without a driver or GPU (never throws).
int cuda_device_count();

// Starts creating `d`'s CUDA context on a background thread (about 0.3 s) and returns at once;
// the first work on `d` waits for it. A shape-only pass (plan_kernels) needs no context, so a
// run can plan and start compiling its kernels meanwhile. Nothing to do for the CPU; throws
// DeviceError when the GPU does not exist.
void open_device_async(Device d);

// Waits until the work kiln has queued on `d` has finished, e.g. to time it; nothing to wait
// for on the CPU, where every op has finished when it returns.
void synchronize(Device d);

}  // namespace kiln
