// jitcc's JSON output: whatever a string holds (paths, NVRTC logs), the output parses
// and reads back the same; invalid UTF-8 becomes U+FFFD instead of breaking the document.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>

#include "../../tools/jitcc/cli.h"

using jitcc::dump_json;
using jitcc::Json;

TEST_CASE("jitcc json: strings with quotes, backslashes and control characters round-trip") {
  const std::string nasty = std::string("quote\" back\\slash\nnew\ttab\r\b\f") + '\x01' + '\x1f' + "/ é ∑ 😀";
  const std::string text = dump_json(Json{{"s", nasty}, {"empty", ""}});
  CHECK(text.find('\n') == std::string::npos);  // one line
  const auto v = nlohmann::json::parse(text);
  CHECK(v.at("s") == nasty);
  CHECK(v.at("empty") == "");
}

TEST_CASE("jitcc json: invalid UTF-8 is replaced, so the document stays valid") {
  const std::string bad = std::string("a") + '\xff' + "b" + '\xc3' + "" + '\xe2' + '\x82' + "c" + '\xed' + '\xa0' +
                          '\x80';  // stray byte, truncated sequences, an encoded surrogate
  const std::string s = nlohmann::json::parse(dump_json(Json{{"s", bad}})).at("s").get<std::string>();
  CHECK(s.find("a\xef\xbf\xbd"
               "b") == 0);
  CHECK(s.find('c') != std::string::npos);
  CHECK(s.find('\xff') == std::string::npos);
}

TEST_CASE("jitcc json: numbers, booleans, null, nesting and key order") {
  const std::string text = dump_json(Json{{"u", std::uint64_t{18446744073709551615ull}},
                                          {"i", -42},
                                          {"d", 0.1},
                                          {"nan", std::nan("")},
                                          {"t", true},
                                          {"n", nullptr},
                                          {"a", Json::array({1, "x", Json::object()})},
                                          {"o", Json{{"k", Json::array()}}}});
  CHECK(text.find("18446744073709551615") != std::string::npos);
  const auto v = Json::parse(text);
  CHECK(v.at("u").get<std::uint64_t>() == 18446744073709551615ull);
  CHECK(v.at("i") == -42);
  CHECK(v.at("d").get<double>() == 0.1);
  CHECK(v.at("nan").is_null());  // JSON has no NaN
  CHECK(v.at("t") == true);
  CHECK(v.at("n").is_null());
  CHECK(v.at("a").size() == 3);
  CHECK(v.at("a").at(1) == "x");
  CHECK(v.at("o").at("k").size() == 0);
  CHECK(v.begin().key() == "u");  // insertion order, not sorted
  CHECK(std::prev(v.end()).key() == "o");
}
