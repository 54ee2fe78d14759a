// Recursive-descent JSON reader (strict RFC 8259: no comments, no trailing commas,
// no leading zeros, valid UTF-8 and escapes) and serde_json-compatible string escaping.
#include "json.h"

#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::io {

namespace {

constexpr int kMaxDepth = 64;

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  JsonValue document() {
    skip_ws();
    JsonValue v = value(0);
    skip_ws();
    if (i_ != s_.size()) fail("the end of the JSON text");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& expected) const { throw JsonError(i_, expected); }
  bool at_end() const { return i_ >= s_.size(); }
  unsigned char peek() const { return at_end() ? 0 : static_cast<unsigned char>(s_[i_]); }

  void skip_ws() {
    while (!at_end() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  void expect(char c, const char* what) {
    if (peek() != static_cast<unsigned char>(c)) fail(what);
    ++i_;
  }

  JsonValue value(int depth) {
    if (depth > kMaxDepth) fail("at most 64 levels of nesting");
    JsonValue v;
    v.pos = i_;
    const unsigned char c = peek();
    if (c == '{') {
      object(v, depth);
    } else if (c == '[') {
      array(v, depth);
    } else if (c == '"') {
      v.kind = JsonValue::Kind::string;
      v.text = string();
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      number(v);
    } else if (literal("true") || literal("false")) {
      v.kind = JsonValue::Kind::boolean;
      v.boolean = s_[v.pos] == 't';
    } else if (!literal("null")) {
      fail("a JSON value");
    }
    return v;
  }

  bool literal(std::string_view word) {
    if (s_.substr(i_, word.size()) != word) return false;
    i_ += word.size();
    return true;
  }

  void object(JsonValue& v, int depth) {
    v.kind = JsonValue::Kind::object;
    ++i_;
    skip_ws();
    if (peek() == '}') {
      ++i_;
      return;
    }
    for (;;) {
      skip_ws();
      if (peek() != '"') fail("a string key");
      std::string key = string();
      skip_ws();
      expect(':', "':' after an object key");
      skip_ws();
      v.members.emplace_back(std::move(key), value(depth + 1));
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      expect('}', "',' or '}' in an object");
      return;
    }
  }

  void array(JsonValue& v, int depth) {
    v.kind = JsonValue::Kind::array;
    ++i_;
    skip_ws();
    if (peek() == ']') {
      ++i_;
      return;
    }
    for (;;) {
      skip_ws();
      v.items.push_back(value(depth + 1));
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      expect(']', "',' or ']' in an array");
      return;
    }
  }

  void number(JsonValue& v) {
    v.kind = JsonValue::Kind::number;
    const std::size_t start = i_;
    auto digits = [&] {
      const std::size_t from = i_;
      while (peek() >= '0' && peek() <= '9') ++i_;
      if (i_ == from) fail("a digit");
    };
    if (peek() == '-') ++i_;
    if (peek() == '0') {
      ++i_;
      if (peek() >= '0' && peek() <= '9') fail("no leading zeros in a number");
    } else {
      digits();
    }
    if (peek() == '.') {
      ++i_;
      digits();
    }
    if (peek() == 'e' || peek() == 'E') {
      ++i_;
      if (peek() == '+' || peek() == '-') ++i_;
      digits();
    }
    v.text = std::string(s_.substr(start, i_ - start));
  }

  unsigned hex4() {
    unsigned u = 0;
    for (int k = 0; k < 4; ++k) {
      const unsigned char c = peek();
      unsigned d;
      if (c >= '0' && c <= '9')
        d = c - '0';
      else if (c >= 'a' && c <= 'f')
        d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        d = c - 'A' + 10;
      else
        fail("4 hex digits after \\u");
      u = u * 16 + d;
      ++i_;
    }
    return u;
  }

  static void append_utf8(std::string& out, std::uint32_t cp) {
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

  // One UTF-8 sequence copied as is; overlong forms, surrogates and values past U+10FFFF are rejected.
  void utf8(std::string& out) {
    // Lead byte: how many continuation bytes follow, its payload bits, the smallest code point
    // that needs this length (anything below is an overlong form).
    struct Lead {
      unsigned char mask, value;
      int n;
      std::uint32_t min;
    };
    static constexpr Lead kLeads[] = {
        {0x80, 0x00, 0, 0}, {0xE0, 0xC0, 1, 0x80}, {0xF0, 0xE0, 2, 0x800}, {0xF8, 0xF0, 3, 0x10000}};
    const unsigned char c = peek();
    const Lead* lead = nullptr;
    for (const Lead& l : kLeads)
      if ((c & l.mask) == l.value) lead = &l;
    if (!lead) fail("valid UTF-8");
    const int n = lead->n;
    const std::uint32_t min = lead->min;
    std::uint32_t cp = c & static_cast<unsigned char>(~lead->mask & 0x7F);
    const std::size_t start = i_++;
    for (int k = 0; k < n; ++k) {
      if ((peek() & 0xC0) != 0x80) fail("valid UTF-8");
      cp = (cp << 6) | (peek() & 0x3F);
      ++i_;
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      i_ = start;
      fail("valid UTF-8");
    }
    out.append(s_.substr(start, i_ - start));
  }

  std::string string() {
    ++i_;  // the opening quote
    std::string out;
    for (;;) {
      if (at_end()) fail("a closing '\"'");
      const unsigned char c = peek();
      if (c == '"') {
        ++i_;
        return out;
      }
      if (c < 0x20) fail("no raw control characters in a string");
      if (c != '\\') {
        utf8(out);
        continue;
      }
      ++i_;
      const unsigned char e = peek();
      ++i_;
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          std::uint32_t cp = hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail("a high surrogate before a low one");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (!literal("\\u")) fail("a low surrogate after a high one");
            const std::uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("a low surrogate after a high one");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default:
          --i_;
          fail("a valid escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
      }
    }
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

}  // namespace

std::optional<std::uint64_t> JsonValue::as_uint() const {
  if (kind != Kind::number || text.empty() || text.size() > 20) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    const std::uint64_t d = static_cast<std::uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

JsonValue parse_json(std::string_view text) { return Parser(text).document(); }

void append_json_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 0xF];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

}  // namespace kiln::io
