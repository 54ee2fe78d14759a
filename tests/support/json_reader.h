#pragma once
// A strict little JSON reader for tests: parse_json accepts exactly one value
// (surrounding whitespace allowed) and throws, naming the offset, on anything else.
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln_test {

class JsonValue {
 public:
  enum class Type { null, boolean, number, string, array, object };

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::null; }
  bool has(std::string_view key) const {
    for (const auto& [k, v] : object())
      if (k == key) return true;
    return false;
  }
  const JsonValue& operator[](std::string_view key) const {
    for (const auto& [k, v] : object())
      if (k == key) return v;
    throw std::runtime_error("json: no key '" + std::string(key) + "'");
  }
  const JsonValue& operator[](std::size_t i) const {
    const auto& a = array();
    if (i >= a.size()) throw std::runtime_error("json: index " + std::to_string(i) + " out of range");
    return a[i];
  }
  std::size_t size() const { return type_ == Type::object ? object().size() : array().size(); }

  bool boolean() const { return expect(Type::boolean), b_; }
  double number() const { return expect(Type::number), num_; }
  std::int64_t integer() const { return static_cast<std::int64_t>(number()); }
  const std::string& str() const { return expect(Type::string), str_; }
  const std::vector<JsonValue>& array() const { return expect(Type::array), arr_; }
  const std::vector<std::pair<std::string, JsonValue>>& object() const { return expect(Type::object), obj_; }

 private:
  friend class JsonParser;
  void expect(Type t) const {
    if (type_ != t) throw std::runtime_error("json: value has another type");
  }
  Type type_ = Type::null;
  bool b_ = false;
  double num_ = 0;
  std::string str_;
  std::vector<JsonValue> arr_;
  std::vector<std::pair<std::string, JsonValue>> obj_;
};

class JsonParser {
 public:
  explicit JsonParser(std::string_view text) : s_(text) {}

  JsonValue parse_document() {
    JsonValue v = value(0);
    skip_ws();
    if (i_ != s_.size()) fail("trailing characters after the value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error("json: " + why + " at offset " + std::to_string(i_));
  }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) ++i_;
  }
  bool eat(char c) {
    skip_ws();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  void literal(std::string_view word) {
    if (s_.substr(i_, word.size()) != word) fail("bad literal");
    i_ += word.size();
  }

  JsonValue value(int depth) {
    if (depth > 64) fail("nesting too deep");
    skip_ws();
    if (i_ >= s_.size()) fail("unexpected end");
    JsonValue v;
    char c = s_[i_];
    if (c == '{') {
      ++i_;
      v.type_ = JsonValue::Type::object;
      if (eat('}')) return v;
      do {
        skip_ws();
        if (i_ >= s_.size() || s_[i_] != '"') fail("expected a key");
        std::string key = string();
        if (!eat(':')) fail("expected ':'");
        v.obj_.emplace_back(std::move(key), value(depth + 1));
      } while (eat(','));
      if (!eat('}')) fail("expected ',' or '}'");
    } else if (c == '[') {
      ++i_;
      v.type_ = JsonValue::Type::array;
      if (eat(']')) return v;
      do v.arr_.push_back(value(depth + 1));
      while (eat(','));
      if (!eat(']')) fail("expected ',' or ']'");
    } else if (c == '"') {
      v.type_ = JsonValue::Type::string;
      v.str_ = string();
    } else if (c == 't' || c == 'f') {
      v.type_ = JsonValue::Type::boolean;
      v.b_ = c == 't';
      literal(v.b_ ? "true" : "false");
    } else if (c == 'n') {
      literal("null");
    } else {
      v.type_ = JsonValue::Type::number;
      v.num_ = number();
    }
    return v;
  }

  double number() {
    std::size_t start = i_;
    auto digits = [&] {
      std::size_t d = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      if (i_ == d) fail("expected a digit");
    };
    if (s_[i_] == '-') ++i_;
    if (i_ < s_.size() && s_[i_] == '0')
      ++i_;
    else
      digits();
    if (i_ < s_.size() && s_[i_] == '.') ++i_, digits();
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      digits();
    }
    return std::strtod(std::string(s_.substr(start, i_ - start)).c_str(), nullptr);
  }

  unsigned hex4() {
    if (i_ + 4 > s_.size()) fail("short \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= static_cast<unsigned>(c - 'A' + 10);
      else
        fail("bad \\u escape");
    }
    return v;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string string() {
    ++i_;  // opening quote
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("unterminated string");
      char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("raw control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) fail("unterminated escape");
      switch (char e = s_[i_++]) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {
            if (s_.substr(i_, 2) != "\\u") fail("lone high surrogate");
            i_ += 2;
            unsigned lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("bad low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("lone low surrogate");
          }
          append_utf8(out, cp);
          break;
        }
        default:
          fail("bad escape");
      }
    }
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

inline JsonValue parse_json(std::string_view text) { return JsonParser(text).parse_document(); }

}  // namespace kiln_test
