#include "disk_cache_format.h"

#include <algorithm>
#include <map>

#include "sha256.h"

namespace fs = std::filesystem;

namespace kiln::rt {
namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'M', 'O', 'D', '\0'};
constexpr std::size_t kPrefixBytes = 16;  // magic, format version, header-text length
constexpr std::size_t kSuffixBytes = 16;  // payload size, payload checksum
constexpr std::uint32_t kMaxHeaderText = 1 << 20;

void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

std::uint64_t get_le(std::string_view s, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= std::uint64_t(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

std::uint64_t payload_checksum(std::string_view a, std::string_view b = {}, std::string_view c = {}) {
  Sha256 h;
  h.update(a);
  h.update(b);
  h.update(c);
  Sha256::Digest d = h.finish();
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t(d[i]) << (8 * i);  // the digest's first 8 bytes, in file order
  return v;
}

// Header values are one line each; options or op names never hold newlines, but escape anyway.
std::string escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

bool unescape(std::string_view v, std::string* out) {
  out->clear();
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] != '\\') {
      *out += v[i];
      continue;
    }
    if (++i == v.size()) return false;
    if (v[i] == 'n')
      *out += '\n';
    else if (v[i] == '\\')
      *out += '\\';
    else
      return false;
  }
  return true;
}

std::string header_text(const EntryHeader& h) {
  std::string t;
  auto line = [&](const char* k, const std::string& v) { t += std::string(k) + "=" + escape(v) + "\n"; };
  line("op", h.key.op);
  line("dtypes", h.key.dtypes);
  line("variant", std::to_string(h.key.variant));
  line("arch", std::to_string(h.key.arch));
  line("kind", h.key.kind);
  line("nvrtc", h.key.nvrtc_version);
  line("options", h.key.options);
  line("digest", h.key.digest);
  if (!h.key.label.empty()) line("label", h.key.label);
  if (!h.key.function.empty()) line("function", h.key.function);
  if (!h.key.bundle.empty()) line("bundle", h.key.bundle);
  line("created", std::to_string(h.created));
  line("source_bytes", std::to_string(h.source_bytes));
  line("ptx_bytes", std::to_string(h.ptx_bytes));
  line("cubin_bytes", std::to_string(h.cubin_bytes));
  return t;
}

// Returns why the text is not a header, or "" with *h filled.
std::string parse_header(std::string_view text, EntryHeader* h) {
  std::map<std::string, std::string, std::less<>> fields;
  while (!text.empty()) {
    std::size_t nl = text.find('\n');
    if (nl == std::string_view::npos) return "last line has no newline";
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl + 1);
    std::size_t eq = line.find('=');
    if (eq == std::string_view::npos) return "line '" + std::string(line.substr(0, 40)) + "' has no '='";
    std::string value;
    if (!unescape(line.substr(eq + 1), &value)) return "bad escape in '" + std::string(line.substr(0, eq)) + "'";
    if (!fields.emplace(std::string(line.substr(0, eq)), std::move(value)).second) {
      return "duplicate field '" + std::string(line.substr(0, eq)) + "'";
    }
  }
  std::string missing;
  auto text_field = [&](const char* k, std::string* out) {
    auto it = fields.find(k);
    if (it == fields.end()) return missing = k, false;
    *out = it->second;
    return true;
  };
  auto int_field = [&](const char* k, auto* out) {
    auto it = fields.find(k);
    if (it == fields.end() || !parse_int(it->second, out)) return missing = k, false;
    return true;
  };
  EntryKey& k = h->key;
  bool ok = text_field("op", &k.op) && text_field("dtypes", &k.dtypes) && int_field("variant", &k.variant) &&
            int_field("arch", &k.arch) && text_field("kind", &k.kind) && text_field("nvrtc", &k.nvrtc_version) &&
            text_field("options", &k.options) && text_field("digest", &k.digest) && int_field("created", &h->created) &&
            int_field("source_bytes", &h->source_bytes) && int_field("ptx_bytes", &h->ptx_bytes) &&
            int_field("cubin_bytes", &h->cubin_bytes);
  for (auto [name, field] : {std::pair{"label", &k.label}, {"function", &k.function}, {"bundle", &k.bundle}})
    if (auto it = fields.find(name); it != fields.end()) *field = it->second;
  return ok ? "" : "field '" + missing + "' missing or malformed";
}

}  // namespace

std::string entry_digest(const EntryKey& k, const std::string& source) {
  // Length-prefixed fields, so no two different keys serialize to the same bytes.
  Sha256 h;
  auto field = [&](std::string_view s) {
    std::string len;
    put_le(len, s.size(), 8);
    h.update(len);
    h.update(s);
  };
  field("kiln-entry");
  field(source);
  field(k.options);
  field(k.nvrtc_version);
  field(std::to_string(k.arch));
  field(k.kind);
  field(std::to_string(DiskCache::kFormatVersion));
  return to_hex(h.finish());
}

std::string encode_entry(const Entry& e, const std::string& digest, std::int64_t created) {
  EntryHeader h{e.key, created, e.source.size(), e.ptx.size(), e.cubin.size()};
  h.key.digest = digest;
  std::string text = header_text(h);
  std::string bytes(kMagic, sizeof kMagic);
  put_le(bytes, DiskCache::kFormatVersion, 4);
  put_le(bytes, text.size(), 4);
  bytes += text;
  const std::uint64_t payload = e.source.size() + e.ptx.size() + e.cubin.size();
  put_le(bytes, payload, 8);
  put_le(bytes, payload_checksum(e.source, e.ptx, e.cubin), 8);
  bytes.reserve(bytes.size() + payload);
  bytes += e.source;
  bytes += e.ptx;
  bytes += e.cubin;
  return bytes;
}

bool has_entry_magic(std::string_view bytes) {
  return bytes.size() >= sizeof kMagic && bytes.compare(0, sizeof kMagic, std::string_view(kMagic, sizeof kMagic)) == 0;
}

std::string check_layout(std::string_view bytes, std::uint64_t file_size, EntryLayout* l) {
  if (file_size == 0) return "empty file";
  if (file_size < kPrefixBytes) {
    return "too short for the fixed header: " + std::to_string(file_size) + " bytes, need " +
           std::to_string(kPrefixBytes);
  }
  if (bytes.size() < kPrefixBytes) {  // the fixed header is needed before anything can be judged
    l->payload_at = kPrefixBytes;
    return std::string(kNeedMoreBytes);
  }
  if (bytes.compare(0, sizeof kMagic, kMagic, sizeof kMagic) != 0) return "bad magic (not a kiln cache entry)";
  std::uint32_t version = static_cast<std::uint32_t>(get_le(bytes, 8, 4));
  if (version != DiskCache::kFormatVersion) {
    return "format version " + std::to_string(version) + ", expected " + std::to_string(DiskCache::kFormatVersion);
  }
  std::uint64_t text_len = get_le(bytes, 12, 4);
  l->payload_at = kPrefixBytes + text_len + kSuffixBytes;
  if (text_len > kMaxHeaderText) return "header unparsable: header text of " + std::to_string(text_len) + " bytes";
  if (file_size < l->payload_at) {
    return "truncated inside the header: " + std::to_string(file_size) + " bytes present, header needs " +
           std::to_string(l->payload_at);
  }
  if (bytes.size() < l->payload_at) return std::string(kNeedMoreBytes);
  if (std::string why = parse_header(bytes.substr(kPrefixBytes, text_len), &l->header); !why.empty()) {
    return "header unparsable: " + why;
  }
  l->header_ok = true;
  l->payload_size = get_le(bytes, kPrefixBytes + text_len, 8);
  l->checksum = get_le(bytes, kPrefixBytes + text_len + 8, 8);
  std::uint64_t present = file_size - l->payload_at;
  if (present < l->payload_size) {
    return "truncated: " + std::to_string(present) + " payload bytes present, header says " +
           std::to_string(l->payload_size);
  }
  if (present > l->payload_size) {
    return "trailing data: " + std::to_string(present) + " payload bytes present, header says " +
           std::to_string(l->payload_size);
  }
  return "";
}

std::string check_consistency(const EntryLayout& l, const fs::path& p) {
  const EntryHeader& h = l.header;
  if (h.source_bytes > l.payload_size || h.ptx_bytes > l.payload_size || h.cubin_bytes > l.payload_size ||
      h.source_bytes + h.ptx_bytes + h.cubin_bytes != l.payload_size) {
    return "section sizes do not add up: source " + std::to_string(h.source_bytes) + " + ptx " +
           std::to_string(h.ptx_bytes) + " + cubin " + std::to_string(h.cubin_bytes) + " != payload " +
           std::to_string(l.payload_size);
  }
  std::string name = p.stem().string();
  if (h.key.digest != name) return "digest field " + h.key.digest + " differs from the file name " + name;
  return "";
}

std::string decode_entry(std::string_view bytes, const fs::path& p, Entry* out, EntryLayout* layout) {
  EntryLayout& l = *layout;
  if (std::string why = check_layout(bytes, bytes.size(), &l); !why.empty()) return why;
  std::string_view payload = bytes.substr(l.payload_at);
  if (std::uint64_t sum = payload_checksum(payload); sum != l.checksum) return "payload checksum mismatch";
  if (std::string why = check_consistency(l, p); !why.empty()) return why;
  out->key = l.header.key;
  out->source.assign(payload.substr(0, l.header.source_bytes));
  out->ptx.assign(payload.substr(l.header.source_bytes, l.header.ptx_bytes));
  out->cubin.assign(payload.substr(l.header.source_bytes + l.header.ptx_bytes));
  if (entry_digest(out->key, out->source) != out->key.digest) {
    return "digest " + out->key.digest + " does not match the hash of its key and source (edited or foreign entry)";
  }
  return "";
}

}  // namespace kiln::rt
