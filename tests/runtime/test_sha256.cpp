// SHA-256 against the FIPS 180-4 / NIST example vectors, plus padding boundaries.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <utility>

#include "sha256.h"

using kiln::rt::Sha256;
using kiln::rt::sha256_hex;
using kiln::rt::to_hex;

TEST_CASE("sha256: standard vectors") {
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmn"
                   "opqrstnopqrstu") == "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  CHECK(sha256_hex(std::string(1000000, 'a')) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("sha256: lengths around the 56- and 64-byte padding boundaries") {
  // Reference digests from Python's hashlib.
  const std::pair<int, const char*> cases[] = {
      {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
      {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
      {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
      {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
      {65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
      {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
      {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
  };
  for (auto item : cases) {
    const auto n = item.first;  // named, not bound: clang 14 cannot capture bindings
    const auto want = item.second;
    CAPTURE(n);
    CHECK(sha256_hex(std::string(n, 'a')) == want);
  }
}

TEST_CASE("sha256: streaming in uneven pieces equals one update; every byte value hashes") {
  std::string data;
  for (int rep = 0; rep < 40; ++rep) {
    for (int b = 0; b < 256; ++b) data += static_cast<char>(b);
  }
  const char* want = "e96760a87768717bcebcfd25ddc7d46b4dbc95a4b0014def080c08539f7d90d0";
  CHECK(sha256_hex(data) == want);
  Sha256 h;
  std::size_t at = 0;
  for (std::size_t piece = 1; at < data.size(); piece = piece * 3 % 97 + 1) {
    std::size_t n = std::min(piece, data.size() - at);
    h.update(data.data() + at, n);
    at += n;
  }
  CHECK(to_hex(h.finish()) == want);
}
