// nlohmann's SAX events carry no offsets, so the input iterator records how far its lexer
// has read, and each value's offset is the first byte after the previous token that is
// not whitespace or a separator.
#include "json_tree.h"

#include <iterator>
#include <nlohmann/json.hpp>

namespace kiln::io {

namespace {

constexpr std::size_t kMaxDepth = 64;

// A char iterator that publishes the furthest position read.
struct TrackedChar {
  using iterator_category = std::forward_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  const char* p = nullptr;
  const char** read_to = nullptr;

  reference operator*() const { return *p; }
  TrackedChar& operator++() {
    *read_to = ++p;
    return *this;
  }
  TrackedChar operator++(int) {
    TrackedChar old = *this;
    ++*this;
    return old;
  }
  bool operator==(const TrackedChar& o) const { return p == o.p; }
  bool operator!=(const TrackedChar& o) const { return p != o.p; }
};

class TreeBuilder {
 public:
  using json = nlohmann::json;

  explicit TreeBuilder(std::string_view text) : text_(text), read_to_(text.data()) {}

  JsonValue parse() {
    TrackedChar first{text_.data(), &read_to_}, last{text_.data() + text_.size(), &read_to_};
    json::sax_parse(first, last, this, json::input_format_t::json, /*strict=*/true);
    return std::move(root_);
  }

  bool null() { return add(JsonValue::Kind::null), true; }
  bool boolean(bool b) { return add(JsonValue::Kind::boolean).boolean = b, true; }
  bool number_integer(json::number_integer_t) { return add(JsonValue::Kind::number), true; }  // written with '-'
  bool number_unsigned(json::number_unsigned_t u) { return add(JsonValue::Kind::number).uint = u, true; }
  bool number_float(json::number_float_t, const json::string_t&) { return add(JsonValue::Kind::number), true; }
  bool string(json::string_t& s) { return add(JsonValue::Kind::string).text = std::move(s), true; }
  bool binary(json::binary_t&) { return false; }  // JSON text has none
  bool start_object(std::size_t) { return open(JsonValue::Kind::object); }
  bool start_array(std::size_t) { return open(JsonValue::Kind::array); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    start_of_token();
    key_ = std::move(k);
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const json::exception& e) {
    // e.what(): "[json.exception.parse_error.101] parse error at line 1, column 8: syntax error ...".
    std::string why = e.what();
    if (auto colon = why.find(": "); colon != std::string::npos) why.erase(0, colon + 2);
    // The lexer's last token may hold raw bytes of any kind; what it expected says enough.
    if (auto last = why.find("; last read: "); last != std::string::npos) {
      auto expected = why.find("; expected ", last);
      why.erase(last, expected == std::string::npos ? std::string::npos : expected - last);
    }
    throw JsonError(position > 0 ? position - 1 : 0, "valid JSON (" + why + ")");
  }

 private:
  // Where the token that produced the current event begins.
  std::size_t start_of_token() {
    std::size_t i = done_;
    while (i < text_.size() && (text_[i] == ' ' || text_[i] == '\t' || text_[i] == '\n' || text_[i] == '\r' ||
                                text_[i] == ',' || text_[i] == ':'))
      ++i;
    done_ = static_cast<std::size_t>(read_to_ - text_.data());
    return i;
  }

  JsonValue& add(JsonValue::Kind kind) {
    const std::size_t pos = start_of_token();
    if (open_.size() > kMaxDepth) throw JsonError(pos, "at most 64 levels of nesting");
    JsonValue v;
    v.kind = kind;
    v.pos = pos;
    if (open_.empty()) return root_ = std::move(v);
    JsonValue& parent = *open_.back();
    if (parent.is(JsonValue::Kind::array)) return parent.items.emplace_back(std::move(v));
    parent.members.push_back(JsonMember{std::move(key_), std::move(v)});
    return parent.members.back().value;
  }
  bool open(JsonValue::Kind kind) {
    open_.push_back(&add(kind));
    return true;
  }
  bool close() {
    done_ = static_cast<std::size_t>(read_to_ - text_.data());
    open_.pop_back();
    return true;
  }

  std::string_view text_;
  const char* read_to_;
  std::size_t done_ = 0;          // bytes consumed by the events so far
  std::vector<JsonValue*> open_;  // the containers being filled, outermost first
  std::string key_;
  JsonValue root_;
};

}  // namespace

JsonValue::JsonValue() = default;

JsonValue parse_json(std::string_view text) {
  // nlohmann skips a UTF-8 byte order mark; RFC 8259 parsers (serde_json) reject it.
  if (text.substr(0, 3) == "\xEF\xBB\xBF") throw JsonError(0, "a JSON value, not a byte order mark");
  // nlohmann's lexer reads a NUL as the end of input, so "{}\0garbage" would pass. JSON text holds
  // no NUL anywhere (in a string it must be escaped), and serde_json refuses one too.
  if (const std::size_t nul = text.find('\0'); nul != std::string_view::npos)
    throw JsonError(nul, "no NUL byte (padding after the JSON is spaces)");
  return TreeBuilder(text).parse();
}

}  // namespace kiln::io
