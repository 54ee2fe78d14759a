#pragma once
// A small strict JSON (RFC 8259) reader and a string writer for safetensors headers.
// Values remember their byte offset so a caller can say where a file went wrong.
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

struct JsonValue {
  enum class Kind { null, boolean, number, string, array, object };
  Kind kind = Kind::null;
  std::size_t pos = 0;  // offset of the value's first byte in the parsed text
  bool boolean = false;
  std::string text;  // a string's decoded UTF-8, or a number's literal
  std::vector<JsonValue> items;
  std::vector<std::pair<std::string, JsonValue>> members;  // object members in text order (keys may repeat)

  bool is(Kind k) const { return kind == k; }
  // A number written as a plain non-negative integer that fits in 64 bits.
  std::optional<std::uint64_t> as_uint() const;
};

// Exactly one value, with whitespace around it; JsonError otherwise. Nesting is capped at
// 64 levels so a hostile header cannot exhaust the stack.
JsonValue parse_json(std::string_view text);

// Appends `s` as a JSON string the way serde_json writes it (the writer Python's
// safetensors uses): \" \\ \b \f \n \r \t, \u00xx for other control bytes, UTF-8 as is.
void append_json_string(std::string& out, std::string_view s);

}  // namespace kiln::io
