// jitcc's JSON writer: whatever a string holds (paths, NVRTC logs), the output parses
// and reads back the same; invalid UTF-8 becomes U+FFFD instead of breaking the document.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>

#include "../../tools/jitcc/json.h"
#include "json_reader.h"

using jitcc::Json;
using kiln_test::parse_json;

TEST_CASE("jitcc json: strings with quotes, backslashes and control characters round-trip") {
  const std::string nasty = std::string("quote\" back\\slash\nnew\ttab\r\b\f") + '\x01' + '\x1f' + "/ é ∑ 😀";
  Json j = Json::object().set("s", nasty).set("empty", "");
  const std::string text = j.dump();
  CHECK(text.find('\n') == std::string::npos);  // one line
  auto v = parse_json(text);
  CHECK(v["s"].str() == nasty);
  CHECK(v["empty"].str().empty());
}

TEST_CASE("jitcc json: invalid UTF-8 is replaced, so the document stays valid") {
  const std::string bad = std::string("a") + '\xff' + "b" + '\xc3' + "" + '\xe2' + '\x82' + "c" + '\xed' + '\xa0' +
                          '\x80';  // stray byte, truncated sequences, an encoded surrogate
  auto v = parse_json(Json::object().set("s", bad).dump());
  const std::string s = v["s"].str();
  CHECK(s.find("a\xef\xbf\xbd"
               "b") == 0);
  CHECK(s.find('c') != std::string::npos);
  CHECK(s.find('\xff') == std::string::npos);
}

TEST_CASE("jitcc json: numbers, booleans, null, nesting and key order") {
  Json j = Json::object()
               .set("u", std::uint64_t{18446744073709551615ull})
               .set("i", -42)
               .set("d", 0.1)
               .set("nan", std::nan(""))
               .set("t", true)
               .set("n", nullptr)
               .set("a", Json::array().push(1).push("x").push(Json::object()))
               .set("o", Json::object().set("k", Json::array()));
  const std::string text = j.dump();
  CHECK(text.find("18446744073709551615") != std::string::npos);
  auto v = parse_json(text);
  CHECK(v["i"].number() == -42);
  CHECK(v["d"].number() == 0.1);
  CHECK(v["nan"].is_null());  // JSON has no NaN
  CHECK(v["t"].boolean());
  CHECK(v["n"].is_null());
  CHECK(v["a"].size() == 3);
  CHECK(v["a"][1].str() == "x");
  CHECK(v["o"]["k"].size() == 0);
  CHECK(v.object().front().first == "u");
  CHECK(v.object().back().first == "o");
}

TEST_CASE("test json reader rejects what is not exactly one value") {
  CHECK_THROWS(parse_json("{} {}"));
  CHECK_THROWS(parse_json("{\"a\":1,}"));
  CHECK_THROWS(parse_json("{\"a\":\"\n\"}"));
  CHECK_THROWS(parse_json(""));
  CHECK_NOTHROW(parse_json(" {\"a\":[1,2.5e3,-0,true,null]}\n"));
}
