// load_safetensors on arbitrary bytes. Only kiln::Error may come out; anything else, or a
// sanitizer report, is a defect. A loaded file must hold exactly the bytes its tensors need.
#include <cstdint>

#include "fuzz_file.h"
#include "kiln/error.h"
#include "kiln/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = kiln_fuzz::write_input(data, size, "input.safetensors");
  try {
    kiln::io::Metadata meta;
    std::uint64_t bytes = 0;
    for (const auto& [name, t] : kiln::io::load_safetensors(path, &meta))
      bytes += static_cast<std::uint64_t>(t.numel()) * t.element_size();
    if (bytes > size) __builtin_trap();  // more tensor data than the file holds
  } catch (const kiln::Error&) {
  }
  return 0;
}
