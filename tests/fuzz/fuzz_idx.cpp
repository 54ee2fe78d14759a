// read_idx on arbitrary bytes, raw or gzip (the reader tells them apart by the 1f 8b magic).
// Only kiln::Error may come out; anything else, or a sanitizer report, is a defect.
#include <cstdint>

#include "fuzz_file.h"
#include "kiln/data/idx.h"
#include "kiln/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = kiln_fuzz::write_input(data, size, "input.idx");
  try {
    const kiln::data::IdxHeader h = kiln::data::read_idx_header(path);
    const kiln::Tensor t = kiln::data::read_idx(path);
    if (t.shape() != h.shape || t.dtype() != h.dtype) __builtin_trap();  // the two readers disagree
  } catch (const kiln::Error&) {
  }
  return 0;
}
