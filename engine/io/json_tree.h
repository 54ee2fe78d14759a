#pragma once
// JSON parsed by nlohmann-json into a tree whose values keep their byte offsets (its DOM
// keeps none, and merges repeated keys), so a safetensors error can say where it is.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/error.h"

namespace kiln::io {

// Malformed JSON: `pos` is the byte offset in the text, `expected` says what should be there.
class JsonError : public ValueError {
 public:
  JsonError(std::size_t pos, std::string expected)
      : ValueError("[json] at byte " + std::to_string(pos) + ": expected " + expected),
        pos_(pos),
        expected_(std::move(expected)) {}
  std::size_t pos() const { return pos_; }
  const std::string& expected() const { return expected_; }

 private:
  std::size_t pos_;
  std::string expected_;
};

struct JsonMember;

struct JsonValue {
  enum class Kind { null, boolean, number, string, array, object };
  Kind kind = Kind::null;
  std::size_t pos = 0;  // offset of the value's first byte in the parsed text
  bool boolean = false;
  std::string text;                   // a string's UTF-8
  std::optional<std::uint64_t> uint;  // a number written as a plain non-negative integer that fits in 64 bits
  std::vector<JsonValue> items;
  std::vector<JsonMember> members;  // object members in text order (keys may repeat)

  // Out of line: clang with libstdc++ cannot form the implicit one (pair<string, JsonValue> is incomplete).
  JsonValue();

  bool is(Kind k) const { return kind == k; }
  std::optional<std::uint64_t> as_uint() const { return uint; }
};

// A separate struct, not a std::pair: a pair needs JsonValue complete where a vector does not.
struct JsonMember {
  std::string key;
  JsonValue value;
};

// Exactly one strict RFC 8259 value, with whitespace around it; JsonError otherwise.
// Nesting is capped at 64 levels.
JsonValue parse_json(std::string_view text);

}  // namespace kiln::io
