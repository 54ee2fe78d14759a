// safetensors reader and writer. The writer lays files out as the reference Rust writer
// (behind Python's safetensors) does, so both produce the same bytes: tensors ordered by
// descending dtype alignment then name, compact JSON, header padded with spaces to 8 bytes.
#include "kiln/io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "atomic_file.h"
#include "json_tree.h"
#include "kiln/autograd.h"
#include "kiln/creation.h"
#include "kiln/error.h"

namespace kiln::io {

namespace {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian, as is the host");

constexpr std::uint64_t kMaxHeader = 100'000'000;  // the Rust reader's limit

struct StDType {
  DType dtype;
  const char* name;
  int order;  // position in the Rust crate's Dtype enum (increasing alignment)
};

constexpr StDType kDTypes[] = {
    {DType::boolean, "BOOL", 0}, {DType::u8, "U8", 1},    {DType::f16, "F16", 7},  {DType::bf16, "BF16", 8},
    {DType::i32, "I32", 9},      {DType::f32, "F32", 11}, {DType::f64, "F64", 12}, {DType::i64, "I64", 13},
};

const StDType& st_of(DType t) {
  for (const StDType& d : kDTypes)
    if (d.dtype == t) return d;
  throw DTypeError("[io] safetensors has no dtype for " + std::string(dtype_name(t)));
}

const StDType* st_named(const std::string& name) {
  for (const StDType& d : kDTypes)
    if (name == d.name) return &d;
  return nullptr;
}

// ---- writing ----

struct Item {
  std::string name;
  Tensor host;  // contiguous, on the CPU
  const StDType* st;
  std::uint64_t bytes;
};

// Compact, in insertion order, UTF-8 unescaped: the bytes serde_json writes for the same header.
std::string header_json(const std::string& path, const std::vector<Item>& items, const Metadata& metadata) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json& m = j["__metadata__"] = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
  }
  std::uint64_t offset = 0;
  for (const Item& it : items) {
    j[it.name] = {{"dtype", it.st->name}, {"shape", it.host.shape()}, {"data_offsets", {offset, offset + it.bytes}}};
    offset += it.bytes;
  }
  std::string text;
  try {
    text = j.dump();
  } catch (const nlohmann::json::type_error& e) {  // a name or metadata string that is not UTF-8
    throw ValueError("[io] " + path + ": tensor names and metadata must be valid UTF-8 (" + e.what() + ")");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

// ---- reading ----

struct Entry {
  std::string name;
  const StDType* st;
  Shape shape;
  std::uint64_t begin, end;
  std::uint64_t at;  // file offset of the entry's JSON, for messages
};

class HeaderReader {
 public:
  explicit HeaderReader(const std::string& path) : path_(path) {}

  [[noreturn]] void fail(const JsonValue& v, const std::string& expected) const {
    throw IoError(path_, 8 + v.pos, "expected " + expected);
  }

  Entry entry(const std::string& name, const JsonValue& v) const {
    const std::string who = "tensor \"" + name + "\"";
    if (!v.is(JsonValue::Kind::object)) fail(v, "an object {dtype, shape, data_offsets} for " + who);
    const JsonValue *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
    for (const auto& [k, m] : v.members) {
      const JsonValue** slot = k == "dtype" ? &dtype : k == "shape" ? &shape : k == "data_offsets" ? &offsets : nullptr;
      if (!slot) fail(m, "only dtype, shape and data_offsets in " + who + ", found \"" + k + "\"");
      if (*slot) fail(m, "one \"" + k + "\" in " + who);
      *slot = &m;
    }
    if (!dtype || !shape || !offsets) fail(v, "dtype, shape and data_offsets for " + who);

    Entry e{name, nullptr, {}, 0, 0, 8 + v.pos};
    if (dtype->is(JsonValue::Kind::string)) e.st = st_named(dtype->text);
    if (!e.st)
      fail(*dtype, "a dtype of F64, F32, F16, BF16, I64, I32, U8 or BOOL for " + who + ", found " +
                       (dtype->is(JsonValue::Kind::string) ? "\"" + dtype->text + "\"" : std::string("a non-string")));
    if (!shape->is(JsonValue::Kind::array)) fail(*shape, "a shape array for " + who);
    // Byte count with overflow checks: dims and their product stay below 2^62.
    std::uint64_t bytes = dtype_size(e.st->dtype);
    bool empty = false;
    for (const JsonValue& d : shape->items) {
      const auto n = d.as_uint();
      if (!n || *n >= (std::uint64_t{1} << 62)) fail(d, "a non-negative integer dimension for " + who);
      e.shape.push_back(static_cast<std::int64_t>(*n));
      if (*n == 0)
        empty = true;
      else if (!empty && bytes > (std::uint64_t{1} << 62) / *n)
        fail(d, "a shape of " + who + " whose size fits in 2^62 bytes");
      else if (!empty)
        bytes *= *n;
    }
    if (empty) bytes = 0;
    if (!offsets->is(JsonValue::Kind::array) || offsets->items.size() != 2)
      fail(*offsets, "data_offsets [begin, end] for " + who);
    const auto b = offsets->items[0].as_uint(), en = offsets->items[1].as_uint();
    if (!b || !en || *b > *en) fail(*offsets, "data_offsets [begin, end] with 0 <= begin <= end for " + who);
    e.begin = *b;
    e.end = *en;
    if (e.end - e.begin != bytes)
      fail(*offsets, "data_offsets of " + who + " spanning " + std::to_string(bytes) + " bytes (" + e.st->name + " " +
                         shape_str(e.shape) + "), found [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                         ")");
    return e;
  }

  Metadata metadata(const JsonValue& v) const {
    if (!v.is(JsonValue::Kind::object)) fail(v, "__metadata__ to be an object of strings");
    Metadata m;
    for (const auto& [k, s] : v.members) {
      if (!s.is(JsonValue::Kind::string)) fail(s, "a string value for __metadata__ key \"" + k + "\"");
      if (!m.emplace(k, s.text).second) fail(s, "one __metadata__ key \"" + k + "\"");
    }
    return m;
  }

 private:
  const std::string& path_;
};

}  // namespace

void save_safetensors(const std::string& path, const nn::NamedTensors& tensors, const Metadata& metadata) {
  NoGradGuard no_grad;
  std::set<std::string> seen;
  std::vector<Item> items;
  for (const auto& [name, t] : tensors) {
    if (name.empty()) throw ValueError("[io] " + path + ": a tensor has an empty name");
    if (name == "__metadata__") throw ValueError("[io] " + path + ": \"__metadata__\" is reserved, not a tensor name");
    if (!seen.insert(name).second) throw ValueError("[io] " + path + ": the name " + name + " appears twice");
    if (!t.defined()) throw ValueError("[io] " + path + ": tensor " + name + " is undefined");
    Tensor host = t.detach().to(Device::cpu()).contiguous();
    const std::uint64_t bytes = static_cast<std::uint64_t>(host.numel()) * host.element_size();
    items.push_back(Item{name, std::move(host), &st_of(t.dtype()), bytes});
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return a.st->order != b.st->order ? a.st->order > b.st->order : a.name < b.name;
  });
  const std::string header = header_json(path, items, metadata);

  AtomicFile f(path);
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(header.size()) >> (8 * i));
  f.write(len, 8);
  f.write(header.data(), header.size());
  for (const Item& it : items) f.write(it.host.data_ptr(), it.bytes);
  f.commit();
}

nn::NamedTensors load_safetensors(const std::string& path, Metadata* metadata) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(path, 0, std::string("expected a readable file (") + std::strerror(errno) + ")");
  std::error_code ec;
  const std::uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) throw IoError(path, 0, "expected a regular file (" + ec.message() + ")");
  if (size < 8)
    throw IoError(path, size,
                  "expected an 8-byte little-endian header length, the file has " + std::to_string(size) + " bytes");
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (n > size - 8 || n > kMaxHeader)
    throw IoError(path, 0,
                  "expected a header length of at most " + std::to_string(std::min(size - 8, kMaxHeader)) +
                      " bytes (the file has " + std::to_string(size) + "), found " + std::to_string(n));
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  if (!in) throw IoError(path, 8, "expected a readable header of " + std::to_string(n) + " bytes");

  JsonValue root;
  try {
    root = parse_json(header);
  } catch (const JsonError& e) {
    throw IoError(path, 8 + e.pos(), "expected " + e.expected() + " in the JSON header");
  }
  const std::uint64_t base = 8 + n, data_size = size - base;
  HeaderReader reader(path);
  if (!root.is(JsonValue::Kind::object)) reader.fail(root, "a JSON object as the header");
  std::vector<Entry> entries;
  std::set<std::string> names;
  Metadata meta;
  for (const auto& [name, v] : root.members) {
    if (!names.insert(name).second) reader.fail(v, "each name once in the header; \"" + name + "\" repeats");
    if (name == "__metadata__") {
      meta = reader.metadata(v);
      continue;
    }
    entries.push_back(reader.entry(name, v));
  }

  // Data must be covered exactly once: sorted by offset, each tensor starts where the last ended.
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  std::uint64_t covered = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    if (e.end > data_size)
      throw IoError(path, size,
                    "expected tensor \"" + e.name + "\" data up to byte " + std::to_string(base + e.end) +
                        " (data_offsets end " + std::to_string(e.end) + "), the file ends at byte " +
                        std::to_string(size));
    if (e.begin < covered)
      throw IoError(path, base + e.begin,
                    "expected tensor \"" + e.name + "\" data [" + std::to_string(e.begin) + ", " +
                        std::to_string(e.end) + ") not to overlap \"" + prev->name + "\" [" +
                        std::to_string(prev->begin) + ", " + std::to_string(prev->end) + ")");
    if (e.begin > covered)
      throw IoError(path, base + covered,
                    "expected tensor data covering every byte; bytes [" + std::to_string(covered) + ", " +
                        std::to_string(e.begin) + ") belong to no tensor");
    covered = e.end;
    prev = &e;
  }
  if (covered != data_size)
    throw IoError(path, base + covered,
                  "expected the end of the file after the last tensor's data, found " +
                      std::to_string(data_size - covered) + " more bytes");

  nn::NamedTensors out;
  for (const Entry& e : entries) {
    Tensor t;
    try {
      t = empty(e.shape, {.dtype = e.st->dtype});
    } catch (const ShapeError& err) {  // e.g. (0, 2^62-1, 2^62-1): no bytes, but strides past int64
      throw IoError(path, e.at, "expected a shape kiln can hold for tensor \"" + e.name + "\" (" + err.what() + ")");
    }
    in.seekg(static_cast<std::streamoff>(base + e.begin));
    in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(e.end - e.begin));
    if (!in) throw IoError(path, base + e.begin, "expected readable data for tensor \"" + e.name + "\"");
    if (e.st->dtype == DType::boolean) {
      // Any nonzero byte is true, as numpy and torch read it; kiln's bool holds only 0 or 1.
      auto* p = static_cast<unsigned char*>(t.data_ptr());
      for (std::uint64_t i = 0; i < e.end - e.begin; ++i) p[i] = p[i] != 0;
    }
    out.emplace_back(e.name, std::move(t));
  }
  if (metadata) *metadata = std::move(meta);
  return out;
}

}  // namespace kiln::io
