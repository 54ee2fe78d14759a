#pragma once
// A small JSON value for jitcc's --json output: objects keep insertion order, strings
// are escaped per RFC 8259 and invalid UTF-8 becomes U+FFFD, so output always parses.
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace jitcc {

class Json {
 public:
  using Array = std::vector<Json>;
  using Object = std::vector<std::pair<std::string, Json>>;

  Json() = default;  // null
  Json(std::nullptr_t) {}
  Json(bool b) : v_(b) {}
  Json(int i) : v_(static_cast<std::int64_t>(i)) {}
  Json(long i) : v_(static_cast<std::int64_t>(i)) {}
  Json(long long i) : v_(static_cast<std::int64_t>(i)) {}
  Json(unsigned i) : v_(static_cast<std::uint64_t>(i)) {}
  Json(unsigned long i) : v_(static_cast<std::uint64_t>(i)) {}
  Json(unsigned long long i) : v_(static_cast<std::uint64_t>(i)) {}
  Json(double d) : v_(d) {}
  Json(const char* s) : v_(std::string(s)) {}
  Json(std::string s) : v_(std::move(s)) {}
  Json(std::string_view s) : v_(std::string(s)) {}
  Json(Array a) : v_(std::move(a)) {}
  Json(Object o) : v_(std::move(o)) {}

  static Json object() { return Json(Object{}); }
  static Json array() { return Json(Array{}); }

  // Appends a member (objects) or an element (arrays); returns *this for chaining.
  Json& set(std::string key, Json value) {
    std::get<Object>(v_).emplace_back(std::move(key), std::move(value));
    return *this;
  }
  Json& push(Json value) {
    std::get<Array>(v_).push_back(std::move(value));
    return *this;
  }

  std::string dump() const {
    std::string out;
    write(out);
    return out;
  }

 private:
  void write(std::string& out) const {
    if (std::holds_alternative<std::monostate>(v_)) {
      out += "null";
    } else if (auto* b = std::get_if<bool>(&v_)) {
      out += *b ? "true" : "false";
    } else if (auto* i = std::get_if<std::int64_t>(&v_)) {
      out += std::to_string(*i);
    } else if (auto* u = std::get_if<std::uint64_t>(&v_)) {
      out += std::to_string(*u);
    } else if (auto* d = std::get_if<double>(&v_)) {
      write_double(out, *d);
    } else if (auto* s = std::get_if<std::string>(&v_)) {
      write_string(out, *s);
    } else if (auto* a = std::get_if<Array>(&v_)) {
      out += '[';
      for (std::size_t k = 0; k < a->size(); ++k) {
        if (k) out += ',';
        (*a)[k].write(out);
      }
      out += ']';
    } else {
      const auto& o = std::get<Object>(v_);
      out += '{';
      for (std::size_t k = 0; k < o.size(); ++k) {
        if (k) out += ',';
        write_string(out, o[k].first);
        out += ':';
        o[k].second.write(out);
      }
      out += '}';
    }
  }

  static void write_double(std::string& out, double d) {
    if (!std::isfinite(d)) {  // JSON has no NaN/Inf
      out += "null";
      return;
    }
    char buf[32];
    auto r = std::to_chars(buf, buf + sizeof buf, d);
    out.append(buf, r.ptr);
  }

  // Length of the valid UTF-8 sequence starting at s[i], or 0 when it is invalid.
  static std::size_t utf8_length(std::string_view s, std::size_t i) {
    auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
    unsigned char c = byte(i);
    std::size_t n;
    std::uint32_t cp;
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0)
      n = 2, cp = c & 0x1F;
    else if ((c & 0xF0) == 0xE0)
      n = 3, cp = c & 0x0F;
    else if ((c & 0xF8) == 0xF0)
      n = 4, cp = c & 0x07;
    else
      return 0;
    if (i + n > s.size()) return 0;
    for (std::size_t k = 1; k < n; ++k) {
      if ((byte(i + k) & 0xC0) != 0x80) return 0;
      cp = (cp << 6) | (byte(i + k) & 0x3F);
    }
    static constexpr std::uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;  // overlong/surrogate
    return n;
  }

  static void write_string(std::string& out, std::string_view s) {
    static constexpr char kHex[] = "0123456789abcdef";
    out += '"';
    for (std::size_t i = 0; i < s.size();) {
      unsigned char c = static_cast<unsigned char>(s[i]);
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
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
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        default:
          if (c < 0x20) {
            out += "\\u00";
            out += kHex[c >> 4];
            out += kHex[c & 0xF];
          } else if (c < 0x80) {
            out += static_cast<char>(c);
          } else if (std::size_t n = utf8_length(s, i)) {
            out.append(s.substr(i, n));
            i += n;
            continue;
          } else {
            out += "\\ufffd";
          }
      }
      ++i;
    }
    out += '"';
  }

  std::variant<std::monostate, bool, std::int64_t, std::uint64_t, double, std::string, Array, Object> v_;
};

}  // namespace jitcc
