// The safetensors header reader: nlohmann-json parses, and every value keeps the byte
// offset that error messages report.
#include <doctest/doctest.h>

#include <string>

#include "io/json_tree.h"
#include "error_message.h"
#include "kiln/kiln.h"
#include "temp_dir.h"

using kiln::io::JsonError;
using kiln::io::JsonValue;
using kiln::io::parse_json;

TEST_CASE("json tree: values keep their offsets, members their order and repeats") {
  const std::string text = " {\"b\" : [1, \"x\" ,{\"k\":null}], \"a\":true,\"b\":-0}\n";
  const JsonValue v = parse_json(text);
  REQUIRE(v.is(JsonValue::Kind::object));
  CHECK(v.pos == 1);
  REQUIRE(v.members.size() == 3);
  CHECK(v.members[0].key == "b");
  CHECK(v.members[2].key == "b");  // repeats are kept, for the caller to reject
  const JsonValue& arr = v.members[0].value;
  CHECK(arr.pos == text.find('['));
  REQUIRE(arr.items.size() == 3);
  CHECK(arr.items[0].pos == text.find('1'));
  CHECK(arr.items[1].text == "x");
  CHECK(arr.items[1].pos == text.find("\"x\""));
  CHECK(arr.items[2].pos == text.find("{\"k\""));
  CHECK(arr.items[2].members[0].value.pos == text.find("null"));
  CHECK(v.members[1].value.boolean);
  CHECK(v.members[1].value.pos == text.find("true"));
  CHECK(v.members[2].value.pos == text.find("-0"));
}

TEST_CASE("json tree: only plain non-negative integers up to 2^64-1 are unsigned") {
  auto uint = [](const std::string& n) { return parse_json("[" + n + "]").items.at(0).as_uint(); };
  CHECK(uint("0") == 0u);
  CHECK(uint("18446744073709551615") == 18446744073709551615ull);
  CHECK_FALSE(uint("18446744073709551616").has_value());
  CHECK_FALSE(uint("-0").has_value());
  CHECK_FALSE(uint("-1").has_value());
  CHECK_FALSE(uint("1.0").has_value());
  CHECK_FALSE(uint("1e3").has_value());
}

TEST_CASE("json tree: malformed text is a JsonError at the offending byte") {
  auto error_at = [](const std::string& text) {
    try {
      parse_json(text);
    } catch (const JsonError& e) {
      return static_cast<long>(e.pos());
    }
    return -1L;
  };
  CHECK(error_at("{\"a\":1,}") == 7);
  CHECK(error_at("{\"a\":01}") == 6);
  CHECK(error_at("[1] [2]") == 4);
  CHECK(error_at("[\"\\ud800\"]") >= 1);  // a lone surrogate
  CHECK(error_at("") == 0);
  CHECK(error_at("\xEF\xBB\xBF{}") == 0);  // serde_json rejects a byte order mark too
  // nlohmann's lexer takes NUL for the end of input; JSON text has no NUL, serde_json refuses it.
  CHECK(error_at(std::string("{}\0 this is not JSON {{{", 24)) == 2);
  CHECK(error_at(std::string("{}  \0", 5)) == 4);
  CHECK(error_at(std::string("{\"a\0\":1}", 9)) == 3);
  CHECK(error_at("{} \t\r\n") == -1);  // JSON whitespace may follow
  CHECK(error_at(std::string(64, '[') + std::string(64, ']')) == -1);
  CHECK(error_at(std::string(65, '[') + "0" + std::string(65, ']')) == 65);
}

TEST_CASE("safetensors save refuses a name that is not UTF-8 instead of writing an unreadable file") {
  kiln_test::TempDir dir;
  const std::string path = dir.file("bad-name.safetensors");
  const std::string msg = kiln_test::message_of<kiln::ValueError>([&] {
    kiln::io::save_safetensors(path, {{std::string("w\xff"), kiln::zeros({1})}});
  });
  CHECK(msg.find("UTF-8") != std::string::npos);
  CHECK(msg.find(path) != std::string::npos);
}
