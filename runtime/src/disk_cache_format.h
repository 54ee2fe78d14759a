#pragma once
// The bytes of one disk cache entry: 8-byte magic "KILNMOD\0", u32 format version,
// u32 header-text length, header text ("key=value\n" lines), u64 payload size,
// u64 payload checksum (first 8 bytes of its SHA-256), payload = source + ptx + cubin.
// Integers are little-endian.
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "kiln/runtime/disk_cache.h"

namespace kiln::rt {

struct EntryHeader {
  EntryKey key;
  std::int64_t created = 0;  // unix seconds
  std::uint64_t source_bytes = 0, ptx_bytes = 0, cubin_bytes = 0;
};

struct EntryLayout {
  EntryHeader header;
  bool header_ok = false;  // header parsed, so its fields can be reported
  std::uint64_t payload_size = 0, checksum = 0;
  std::size_t payload_at = 0;  // offset of the payload; the bytes check_layout needs
};

// check_layout's answer when given fewer than layout.payload_at bytes of a longer file.
inline constexpr std::string_view kNeedMoreBytes = "header not read";

std::string encode_entry(const Entry& e, const std::string& digest, std::int64_t created);
// The file starts with an entry's 8-byte magic: kiln wrote it, whatever else is wrong with it.
bool has_entry_magic(std::string_view bytes);

// Each returns "" when the check passes, else the precise reason.
// Everything up to the payload size, for a file of `file_size` bytes whose start is `bytes`.
std::string check_layout(std::string_view bytes, std::uint64_t file_size, EntryLayout* l);
// Section sizes and the digest field against the file name `p`.
std::string check_consistency(const EntryLayout& l, const std::filesystem::path& p);
// Full validation of a whole file; fills *out when valid, *l as far as it parsed.
std::string decode_entry(std::string_view bytes, const std::filesystem::path& p, Entry* out, EntryLayout* l);

template <class T>
bool parse_int(std::string_view s, T* out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return !s.empty() && ec == std::errc() && end == s.data() + s.size();
}

}  // namespace kiln::rt
