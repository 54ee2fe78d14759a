// load_safetensors on arbitrary bytes. Only kiln::Error may come out; anything else, or a
// sanitizer report, is a defect. A loaded file must hold exactly the bytes its tensors need,
// and its header must be what Python's safetensors accepts: no NUL byte, and nothing but
// JSON whitespace after the closing brace.
#include <cstdint>
#include <cstring>

#include "fuzz_file.h"
#include "kiln/error.h"
#include "kiln/io/safetensors.h"

namespace {

// The header of a file the reader accepted is garbage-free (the NUL case once passed).
bool header_clean(const std::uint8_t* data, std::size_t size) {
  if (size < 8) return false;
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n > size - 8) return false;
  const std::uint8_t* h = data + 8;
  if (std::memchr(h, 0, n)) return false;
  std::uint64_t end = n;
  while (end > 0 && (h[end - 1] == ' ' || h[end - 1] == '\t' || h[end - 1] == '\n' || h[end - 1] == '\r')) --end;
  return end > 0 && h[end - 1] == '}';
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = kiln_fuzz::write_input(data, size, "input.safetensors");
  try {
    kiln::io::Metadata meta;
    std::uint64_t bytes = 0;
    for (const auto& [name, t] : kiln::io::load_safetensors(path, &meta))
      bytes += static_cast<std::uint64_t>(t.numel()) * t.element_size();
    if (bytes > size) __builtin_trap();               // more tensor data than the file holds
    if (!header_clean(data, size)) __builtin_trap();  // garbage in the header accepted
  } catch (const kiln::Error&) {
  }
  return 0;
}
