// The disk cache entry parser on arbitrary bytes: decode_entry on the whole file, and
// check_layout as the directory scan uses it (a first chunk, then the bytes it asks for),
// which must reach the same verdict as check_layout on the whole file.
#include <cstdint>
#include <string>
#include <string_view>

#include "disk_cache_format.h"

namespace rt = kiln::rt;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  rt::EntryLayout whole;
  const std::string verdict = rt::check_layout(bytes, size, &whole);
  // Named as its digest field says, so that the checks past the file name are reached too.
  const std::string name = (whole.header_ok ? whole.header.key.digest : std::string("0123abcd")) + ".kmod";
  rt::EntryLayout layout;
  rt::Entry entry;
  if (rt::decode_entry(bytes, name, &entry, &layout).empty() &&
      entry.source.size() + entry.ptx.size() + entry.cubin.size() > size)
    __builtin_trap();

  // Copies, so that ASan sees any read past what the scan really has in memory.
  const std::string head(bytes.substr(0, size / 2));
  rt::EntryLayout scan;
  std::string why = rt::check_layout(head, size, &scan);
  // At most twice: first the fixed header (when the chunk was shorter), then up to the payload.
  for (std::size_t have = head.size(), round = 0; why == rt::kNeedMoreBytes; ++round) {
    if (round == 2 || scan.payload_at <= have || scan.payload_at > size) __builtin_trap();
    have = scan.payload_at;
    const std::string more(bytes.substr(0, have));
    why = rt::check_layout(more, size, &scan);
  }
  if (why != verdict) __builtin_trap();
  if (scan.header_ok) (void)rt::check_consistency(scan, name);
  return 0;
}
