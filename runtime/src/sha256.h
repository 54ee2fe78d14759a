#pragma once
// SHA-256 (FIPS 180-4): names disk cache entries and checksums their payloads.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::rt {

class Sha256 {
 public:
  using Digest = std::array<std::uint8_t, 32>;

  Sha256();
  void update(const void* data, std::size_t n);
  void update(std::string_view s) { update(s.data(), s.size()); }
  // Pads and returns the digest; the object must not be updated afterwards.
  Digest finish();

 private:
  void compress(const std::uint8_t* block);

  std::array<std::uint32_t, 8> h_;
  std::array<std::uint8_t, 64> buf_{};
  std::size_t buf_len_ = 0;
  std::uint64_t total_bytes_ = 0;
};

Sha256::Digest sha256(std::string_view s);
std::string to_hex(const Sha256::Digest& d);  // lowercase
std::string sha256_hex(std::string_view s);

}  // namespace kiln::rt
