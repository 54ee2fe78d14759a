#include "md5.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>

#include <kiln/kiln.h>

namespace mnist {

namespace {

constexpr std::array<std::uint32_t, 16> kShift = {7, 12, 17, 22, 5, 9, 14, 20, 4, 11, 16, 23, 6, 10, 15, 21};

// K[i] = floor(2^32 * |sin(i + 1)|), computed once.
const std::array<std::uint32_t, 64>& constants() {
  static const auto k = [] {
    std::array<std::uint32_t, 64> t{};
    for (int i = 0; i < 64; ++i) t[i] = static_cast<std::uint32_t>(std::floor(4294967296.0 * std::fabs(std::sin(i + 1.0))));
    return t;
  }();
  return k;
}

std::uint32_t rotl(std::uint32_t x, std::uint32_t c) { return (x << c) | (x >> (32 - c)); }

void block(std::array<std::uint32_t, 4>& h, const unsigned char* p) {
  std::uint32_t m[16];
  for (int i = 0; i < 16; ++i)
    m[i] = std::uint32_t(p[4 * i]) | std::uint32_t(p[4 * i + 1]) << 8 | std::uint32_t(p[4 * i + 2]) << 16 |
           std::uint32_t(p[4 * i + 3]) << 24;
  std::uint32_t a = h[0], b = h[1], c = h[2], d = h[3];
  for (int i = 0; i < 64; ++i) {
    std::uint32_t f;
    int g;
    if (i < 16) {
      f = (b & c) | (~b & d), g = i;
    } else if (i < 32) {
      f = (d & b) | (~d & c), g = (5 * i + 1) % 16;
    } else if (i < 48) {
      f = b ^ c ^ d, g = (3 * i + 5) % 16;
    } else {
      f = c ^ (b | ~d), g = (7 * i) % 16;
    }
    const std::uint32_t next = d;
    d = c;
    c = b;
    b = b + rotl(a + f + constants()[i] + m[g], kShift[(i / 16) * 4 + i % 4]);
    a = next;
  }
  h[0] += a, h[1] += b, h[2] += c, h[3] += d;
}

}  // namespace

std::string md5_hex(const std::string& bytes) {
  std::array<std::uint32_t, 4> h = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476};
  const std::size_t full = bytes.size() / 64 * 64;
  for (std::size_t off = 0; off < full; off += 64) block(h, reinterpret_cast<const unsigned char*>(bytes.data()) + off);
  // The tail, a 1 bit, zeros to 56 mod 64, and the length in bits (little-endian).
  std::string tail = bytes.substr(full);
  tail.push_back(static_cast<char>(0x80));
  while (tail.size() % 64 != 56) tail.push_back('\0');
  const std::uint64_t bits = static_cast<std::uint64_t>(bytes.size()) * 8;
  for (int i = 0; i < 8; ++i) tail.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  for (std::size_t off = 0; off < tail.size(); off += 64) block(h, reinterpret_cast<const unsigned char*>(tail.data()) + off);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (std::uint32_t w : h)
    for (int i = 0; i < 4; ++i) {
      const unsigned byte = (w >> (8 * i)) & 0xff;
      out += hex[byte >> 4];
      out += hex[byte & 15];
    }
  return out;
}

std::string md5_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw kiln::IoError(path, 0, "a readable file");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return md5_hex(bytes);
}

}  // namespace mnist
