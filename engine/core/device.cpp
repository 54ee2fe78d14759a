#include "kiln/device.h"

#include <charconv>

#include "kiln/error.h"
#include "kiln/runtime/device.h"

namespace kiln {

Device Device::cuda(int ordinal) {
  if (ordinal < 0) throw DeviceError("[device] negative CUDA ordinal " + std::to_string(ordinal));
  return Device(Kind::cuda, ordinal);
}

Device Device::parse(std::string_view text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.starts_with("cuda:")) {
    std::string_view num = text.substr(5);
    int ordinal = -1;
    auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), ordinal);
    if (ec == std::errc() && end == num.data() + num.size() && !num.empty() && ordinal >= 0) return cuda(ordinal);
  }
  throw DeviceError("[device] cannot parse '" + std::string(text) + "' (expected cpu, cuda or cuda:N)");
}

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index_); }

std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

int cuda_device_count() { return rt::device_count(); }

void open_device_async(Device d) {
  if (d.is_cuda()) rt::open_device_async(d.index());
}

void synchronize(Device d) {
  if (d.is_cuda()) rt::default_stream(d.index()).synchronize();
}

}  // namespace kiln
