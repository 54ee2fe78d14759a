#pragma once
// A tensor's bytes in a stream-ordered device buffer, and a buffer's bytes back on the host: for
// tests that launch planned kernels on raw operands.
#include <vector>

#include "kiln/kiln.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/memory.h"

namespace kiln_test {

inline kiln::rt::DeviceBuffer upload(const kiln::Tensor& t, const kiln::rt::Stream& s) {
  const std::size_t bytes = static_cast<std::size_t>(t.numel()) * kiln::dtype_size(t.dtype());
  kiln::rt::DeviceBuffer buf(bytes, s);
  kiln::rt::copy_to_device(buf.ptr(), t.contiguous().data_ptr(), bytes, s);
  return buf;
}

inline std::vector<unsigned char> bytes_of(const kiln::rt::DeviceBuffer& b, const kiln::rt::Stream& s) {
  std::vector<unsigned char> host(b.bytes());
  kiln::rt::copy_to_host(host.data(), b.ptr(), host.size(), s);
  s.synchronize();
  return host;
}

}  // namespace kiln_test
