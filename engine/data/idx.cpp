// IDX reader and writer. Offsets in errors count bytes of the decompressed IDX stream,
// except for bytes after a gzip stream, which are located in the compressed file.
#include "kiln/data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "idx_input.h"
#include "kiln/creation.h"
#include "kiln/error.h"

namespace kiln::data {

namespace {

static_assert(std::endian::native == std::endian::little, "kiln assumes a little-endian host");

struct IdxType {
  std::uint8_t code;
  const char* name;  // as the file stores it
  std::size_t size;  // bytes per element in the file
  DType dtype;       // what read_idx returns
};

constexpr IdxType kTypes[] = {
    {0x08, "u8", 1, DType::u8},   {0x09, "i8", 1, DType::i32},  {0x0B, "i16", 2, DType::i32},
    {0x0C, "i32", 4, DType::i32}, {0x0D, "f32", 4, DType::f32}, {0x0E, "f64", 8, DType::f64},
};

std::string hex(unsigned v) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "0x%02X", v);
  return buf;
}

std::uint32_t be32(const unsigned char* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}

template <class T>
T byteswap(T v) {
  auto bytes = std::bit_cast<std::array<unsigned char, sizeof(T)>>(v);
  std::reverse(bytes.begin(), bytes.end());
  return std::bit_cast<T>(bytes);
}

// Big-endian file elements of `type` -> the returned dtype's host elements.
void decode(const IdxType& type, const unsigned char* src, std::int64_t n, void* dst) {
  switch (type.code) {
    case 0x08:
      std::memcpy(dst, src, static_cast<std::size_t>(n));
      break;
    case 0x09:
      for (std::int64_t i = 0; i < n; ++i) static_cast<std::int32_t*>(dst)[i] = static_cast<std::int8_t>(src[i]);
      break;
    case 0x0B:
      for (std::int64_t i = 0; i < n; ++i)
        static_cast<std::int32_t*>(dst)[i] = static_cast<std::int16_t>((src[2 * i] << 8) | src[2 * i + 1]);
      break;
    case 0x0C:
    case 0x0D: {
      auto* out = static_cast<std::uint32_t*>(dst);
      for (std::int64_t i = 0; i < n; ++i) out[i] = be32(src + 4 * i);
      break;
    }
    case 0x0E: {
      auto* out = static_cast<std::uint64_t*>(dst);
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint64_t v;
        std::memcpy(&v, src + 8 * i, 8);
        out[i] = byteswap(v);
      }
      break;
    }
  }
}

// Counts (and discards) what follows the data, to say how much trailing garbage there is.
std::uint64_t count_rest(detail::IdxInput& in) {
  std::vector<unsigned char> scratch(1u << 16);
  std::uint64_t n = 0;
  for (std::size_t r; (r = in.read(scratch.data(), scratch.size())) > 0;) n += r;
  return n;
}

struct Parsed {
  IdxHeader header;
  const IdxType* type;
  std::uint64_t numel;
};

Parsed read_header(detail::IdxInput& in, const std::string& path) {
  unsigned char magic[4];
  const std::size_t got = in.read(magic, 4);
  if (got < 4)
    throw IoError(path, got,
                  "expected the 4-byte IDX header 00 00 <type> <ndim>, the file ends after " + in.bytes(got));
  for (int i = 0; i < 2; ++i)
    if (magic[i] != 0)
      throw IoError(path, static_cast<std::uint64_t>(i), "expected IDX magic byte 0x00, found " + hex(magic[i]));
  const IdxType* type = nullptr;
  for (const IdxType& t : kTypes)
    if (t.code == magic[2]) type = &t;
  if (!type)
    throw IoError(
        path, 2,
        "expected an IDX type code (0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64), found " + hex(magic[2]));
  const int ndim = magic[3];
  if (ndim < 1 || ndim > 8) throw IoError(path, 3, "expected 1 to 8 dimensions, found " + std::to_string(ndim));

  unsigned char dims[32];
  const std::size_t dim_bytes = 4 * static_cast<std::size_t>(ndim);
  if (const std::size_t r = in.read(dims, dim_bytes); r < dim_bytes)
    throw IoError(path, 4 + r,
                  "expected " + std::to_string(ndim) + " big-endian u32 dimensions (" + std::to_string(dim_bytes) +
                      " bytes), the file ends after " + in.bytes(4 + r));
  Parsed p{{type->dtype, {}, 4 + dim_bytes}, type, 1};
  // Bytes stay addressable with a margin: a dim product that only fits in 64 bits is a corrupt file.
  constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 48;
  for (int d = 0; d < ndim; ++d) {
    const std::uint32_t v = be32(dims + 4 * d);
    const std::uint64_t at = 4 + 4 * static_cast<std::uint64_t>(d);
    if (v == 0) throw IoError(path, at, "expected dimension " + std::to_string(d) + " > 0, found 0");
    if (p.numel > kMaxBytes / type->size / v)
      throw IoError(path, at,
                    "expected dimensions whose product fits in 2^48 bytes; dimension " + std::to_string(d) + " = " +
                        std::to_string(v) + " overflows it");
    p.numel *= v;
    p.header.shape.push_back(v);
  }
  return p;
}

std::string describe(const Parsed& p) {
  return std::to_string(p.numel * p.type->size) + " bytes of " + p.type->name + " data for shape " +
         shape_str(p.header.shape);
}

[[noreturn]] void fail_short(const detail::IdxInput& in, const std::string& path, const Parsed& p, std::uint64_t got) {
  throw IoError(path, p.header.data_offset, "expected " + describe(p) + ", the file ends after " + in.bytes(got));
}

[[noreturn]] void fail_extra(const detail::IdxInput& in, const std::string& path, const Parsed& p,
                             std::uint64_t extra) {
  throw IoError(path, p.header.data_offset + p.numel * p.type->size,
                "expected the end of the file after the " + shape_str(p.header.shape) + " " + p.type->name +
                    " data, found " + in.bytes(extra) + " after it");
}

// Before reading: a raw file's size must match the header, and a gzip file must be able to
// hold the data at deflate's best ratio (1032:1), so a lying header allocates nothing large.
void check_size(const detail::IdxInput& in, const std::string& path, const Parsed& p) {
  if (in.file_size() < 0) return;  // a pipe: the incremental read still bounds memory
  const auto size = static_cast<std::uint64_t>(in.file_size());
  const std::uint64_t header = p.header.data_offset, expected = p.numel * p.type->size;
  if (!in.gzip() && size < header + expected) fail_short(in, path, p, size - std::min(size, header));
  if (!in.gzip() && size > header + expected) fail_extra(in, path, p, size - header - expected);
  constexpr std::uint64_t kMaxRatio = 1032;
  if (in.gzip() && size < UINT64_MAX / kMaxRatio && header + expected > size * kMaxRatio)
    throw IoError(path, header,
                  "expected " + describe(p) + ", more than a gzip file of " + std::to_string(size) +
                      " bytes holds (it inflates to at most " + std::to_string(size * kMaxRatio) + " bytes)");
}

}  // namespace

IdxHeader read_idx_header(const std::string& path) {
  detail::IdxInput in(path);
  return read_header(in, path).header;
}

Tensor read_idx(const std::string& path) {
  detail::IdxInput in(path);
  const Parsed p = read_header(in, path);
  check_size(in, path, p);
  const std::uint64_t header = p.header.data_offset, expected = p.numel * p.type->size;
  // Grows with what the file really holds, so a header that lies about its size allocates nothing large.
  std::vector<unsigned char> bytes;
  bytes.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(expected, std::uint64_t{64} << 20)));
  while (bytes.size() < expected) {
    const std::size_t old = bytes.size();
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(expected - old, std::uint64_t{16} << 20));
    bytes.resize(old + want);
    const std::size_t r = in.read(bytes.data() + old, want);
    bytes.resize(old + r);
    if (r < want) break;
  }
  if (bytes.size() < expected) fail_short(in, path, p, bytes.size());
  if (const std::uint64_t extra = count_rest(in); extra > 0) fail_extra(in, path, p, extra);
  in.check_gzip_end(header + expected);

  Tensor out = empty(p.header.shape, {.dtype = p.type->dtype});
  decode(*p.type, bytes.data(), static_cast<std::int64_t>(p.numel), out.data_ptr());
  return out;
}

void write_idx(const std::string& path, const Tensor& t, bool gzip) {
  std::uint8_t code = 0;
  switch (t.dtype()) {
    case DType::u8:
      code = 0x08;
      break;
    case DType::i32:
      code = 0x0C;
      break;
    case DType::f32:
      code = 0x0D;
      break;
    case DType::f64:
      code = 0x0E;
      break;
    default:
      throw DTypeError("[idx] " + path + ": IDX files hold u8, i32, f32 or f64, got " +
                       std::string(dtype_name(t.dtype())));
  }
  if (t.dim() < 1 || t.dim() > 8)
    throw ShapeError("[idx] " + path + ": IDX files hold 1 to 8 dimensions, got shape " + shape_str(t.shape()));
  for (std::int64_t s : t.shape())
    if (s <= 0 || s > std::numeric_limits<std::uint32_t>::max())
      throw ShapeError("[idx] " + path + ": IDX dimensions are 1 to 2^32-1, got shape " + shape_str(t.shape()));

  const Tensor host = t.detach().to(Device::cpu()).contiguous();
  std::vector<unsigned char> buf{0, 0, code, static_cast<unsigned char>(t.dim())};
  for (std::int64_t s : t.shape())
    for (int b = 3; b >= 0; --b) buf.push_back(static_cast<unsigned char>(static_cast<std::uint64_t>(s) >> (8 * b)));
  const std::size_t header = buf.size(), esize = host.element_size();
  const std::size_t n = static_cast<std::size_t>(host.numel());
  buf.resize(header + n * esize);
  const auto* src = static_cast<const unsigned char*>(host.data_ptr());
  for (std::size_t i = 0; i < n; ++i)
    std::reverse_copy(src + i * esize, src + (i + 1) * esize, buf.data() + header + i * esize);

  gzFile f = gzopen(path.c_str(), gzip ? "wb6" : "wbT");  // T: write without compression
  if (!f) throw IoError(path, 0, std::string("expected a writable file (") + std::strerror(errno) + ")");
  std::size_t done = 0;
  while (done < buf.size()) {
    const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(buf.size() - done, 1u << 30));
    const int w = gzwrite(f, buf.data() + done, chunk);
    if (w <= 0) {
      int code_ = Z_OK;
      const std::string why = gzerror(f, &code_);
      gzclose_w(f);
      throw IoError(path, done,
                    "expected room to write " + std::to_string(buf.size() - done) + " more bytes (" + why + ")");
    }
    done += static_cast<std::size_t>(w);
  }
  if (gzclose_w(f) != Z_OK) throw IoError(path, done, "expected a successful close after writing (disk full?)");
}

}  // namespace kiln::data
