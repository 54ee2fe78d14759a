#pragma once
// A strict reader for the XML subset an SVG writer produces: an optional <?xml ...?>
// declaration, comments, elements, quoted attributes, text, the five named entities and
// numeric ones. Anything else (a stray '&' or '<', a mismatched or unclosed tag, a second
// root, a duplicate attribute, a DOCTYPE) is an error naming the offset: a well-formedness check.
#include <cctype>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace tiny_xml {

struct Element {
  std::string name;
  std::map<std::string, std::string> attrs;  // entities decoded
  std::vector<Element> children;
  std::string text;  // all character data directly inside, entities decoded
};

class Parser {
 public:
  explicit Parser(std::string_view doc) : s_(doc) {}

  Element document() {
    if (s_.substr(0, 5) == "<?xml") {
      const std::size_t end = s_.find("?>");
      if (end == std::string_view::npos) fail("an end to the XML declaration");
      i_ = end + 2;
    }
    misc();
    if (!peek("<")) fail("a root element");
    Element root = element();
    misc();
    if (i_ != s_.size()) fail("nothing after the root element but whitespace and comments");
    return root;
  }

 private:
  [[noreturn]] void fail(const std::string& expected) const {
    throw std::runtime_error("XML at offset " + std::to_string(i_) + ": expected " + expected);
  }
  bool peek(std::string_view t) const { return s_.substr(i_, t.size()) == t; }
  void skip_space() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  void comment() {
    const std::size_t end = s_.find("-->", i_ + 4);
    if (end == std::string_view::npos) fail("an end to the comment");
    i_ = end + 3;
  }
  void misc() {  // whitespace and comments around the root
    for (skip_space(); peek("<!--"); skip_space()) comment();
  }
  std::string name() {
    const std::size_t start = i_;
    auto ok = [](char c, bool first) {
      return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':' ||
             (!first && (std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '.'));
    };
    while (i_ < s_.size() && ok(s_[i_], i_ == start)) ++i_;
    if (i_ == start) fail("a name");
    return std::string(s_.substr(start, i_ - start));
  }
  // Character data up to `stop` (not included), entities decoded; '<' never allowed.
  std::string chars(char stop) {
    std::string out;
    while (i_ < s_.size() && s_[i_] != stop) {
      const char c = s_[i_];
      if (c == '<') fail("no '<' in character data or an attribute value");
      if (c != '&') {
        out += c;
        ++i_;
        continue;
      }
      const std::size_t semi = s_.find(';', i_);
      if (semi == std::string_view::npos || semi - i_ > 10) fail("an entity ending in ';'");
      const std::string_view e = s_.substr(i_ + 1, semi - i_ - 1);
      static const std::map<std::string_view, char> named{
          {"amp", '&'}, {"lt", '<'}, {"gt", '>'}, {"quot", '"'}, {"apos", '\''}};
      if (const auto it = named.find(e); it != named.end())
        out += it->second;
      else if (e.size() > 1 && e[0] == '#') {
        const bool hex = e[1] == 'x';
        const std::string digits(e.substr(hex ? 2 : 1));
        if (digits.empty() ||
            digits.find_first_not_of(hex ? "0123456789abcdefABCDEF" : "0123456789") != std::string::npos)
          fail("a numeric character reference");
        const unsigned long v = std::stoul(digits, nullptr, hex ? 16 : 10);
        out += v < 0x80 ? static_cast<char>(v) : '?';
      } else {
        fail("a known entity, not &" + std::string(e) + ";");
      }
      i_ = semi + 1;
    }
    return out;
  }
  Element element() {
    ++i_;  // '<'
    Element el;
    el.name = name();
    for (;;) {
      const std::size_t before = i_;
      skip_space();
      if (peek("/>")) {
        i_ += 2;
        return el;
      }
      if (peek(">")) {
        ++i_;
        break;
      }
      if (i_ == before) fail("whitespace before an attribute");
      const std::string key = name();
      skip_space();
      if (!peek("=")) fail("'=' after attribute " + key);
      ++i_;
      skip_space();
      if (i_ >= s_.size() || (s_[i_] != '"' && s_[i_] != '\'')) fail("a quoted value for attribute " + key);
      const char quote = s_[i_++];
      std::string value = chars(quote);
      if (i_ >= s_.size()) fail("the closing quote of attribute " + key);
      ++i_;
      if (!el.attrs.emplace(key, std::move(value)).second) fail("one attribute " + key);
    }
    for (;;) {
      if (i_ >= s_.size()) fail("</" + el.name + ">");
      if (peek("<!--"))
        comment();
      else if (peek("</")) {
        i_ += 2;
        if (name() != el.name) fail("</" + el.name + ">");
        skip_space();
        if (!peek(">")) fail("'>' closing </" + el.name);
        ++i_;
        return el;
      } else if (peek("<?") || peek("<!")) {
        fail("no processing instruction, DOCTYPE or CDATA inside elements");
      } else if (peek("<")) {
        el.children.push_back(element());
      } else {
        el.text += chars('<');
      }
    }
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

inline Element parse(std::string_view doc) { return Parser(doc).document(); }

// Every element named `name` under (and including) `root`, in document order.
inline void find_all(const Element& root, const std::string& name, std::vector<const Element*>& out) {
  if (root.name == name) out.push_back(&root);
  for (const Element& c : root.children) find_all(c, name, out);
}

}  // namespace tiny_xml
