// safetensors: round trip of every dtype, files compared byte for byte with ones written
// by hand, every malformed header/offset case with its file offset, copy_into's mismatch
// message, checkpoints, and (when Python's safetensors is importable) a file read there.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "error_message.h"
#include "kiln/kiln.h"
#include "temp_dir.h"
#include "test_values.h"

using namespace kiln;
namespace fs = std::filesystem;
using Bytes = std::vector<unsigned char>;

namespace {
using kiln_test::read_bytes;
using kiln_test::write_bytes;
using kiln_test::values;

using kiln_test::TempDir;



// A file: 8-byte little-endian length of `json` (used as is: callers pad it), then json, then data.
Bytes st_file(const std::string& json, const Bytes& data) {
  Bytes b;
  for (int i = 0; i < 8; ++i)
    b.push_back(static_cast<unsigned char>(static_cast<std::uint64_t>(json.size()) >> (8 * i)));
  b.insert(b.end(), json.begin(), json.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

template <class T>
void append(Bytes& b, T v) {
  unsigned char raw[sizeof(T)];
  std::memcpy(raw, &v, sizeof(T));
  b.insert(b.end(), raw, raw + sizeof(T));
}

// The IoError load_safetensors throws for `bytes`, at `offset`; returns its message.
std::string load_error(const TempDir& dir, const Bytes& bytes, std::uint64_t offset) {
  const std::string path = dir.file("bad.safetensors");
  write_bytes(path, bytes);
  try {
    io::load_safetensors(path);
  } catch (const IoError& e) {
    CHECK(e.offset() == offset);
    CHECK(e.file() == path);
    return e.what();
  }
  FAIL("load_safetensors accepted a malformed file");
  return {};
}


}  // namespace

TEST_CASE("safetensors round trip of every dtype, scalars, empty tensors and metadata") {
  TempDir dir;
  const Tensor base = from_vector<double>({0, 1, -2, 3.5, 100, -0.25}, {2, 3});
  nn::NamedTensors in;
  for (DType dt : kAllDTypes) in.emplace_back("t." + std::string(dtype_name(dt)), base.to(dt));
  in.emplace_back("scalar", scalar_tensor(2.5, {.dtype = DType::f64}));
  in.emplace_back("empty", zeros({0, 3}));
  in.emplace_back("view", transpose(base, 0, 1));  // written contiguous
  const std::string path = dir.file("all.safetensors");
  io::save_safetensors(path, in, {{"format", "pt"}, {"note", "a \"quoted\"\nline"}});

  io::Metadata meta;
  const nn::NamedTensors out = io::load_safetensors(path, &meta);
  CHECK(meta == io::Metadata{{"format", "pt"}, {"note", "a \"quoted\"\nline"}});
  REQUIRE(out.size() == in.size());
  for (const auto& item : in) {
    const auto& name = item.first;  // named, not bound: clang 14 cannot capture bindings
    const auto& t = item.second;
    CAPTURE(name);
    const auto it = std::find_if(out.begin(), out.end(), [&](const auto& p) { return p.first == name; });
    REQUIRE(it != out.end());
    CHECK(it->second.device() == Device::cpu());
    CHECK(it->second.dtype() == t.dtype());
    CHECK(it->second.shape() == t.shape());
    CHECK(values(it->second) == values(t));
  }
  // File order: descending alignment (i64, f64, f32, i32, bf16, f16, u8, bool), then name.
  std::vector<std::string> names;
  for (const auto& [name, t] : out) names.push_back(name);
  CHECK(names == std::vector<std::string>{"t.i64", "scalar", "t.f64", "view", "empty", "t.f32", "t.i32", "t.bf16",
                                          "t.f16", "t.u8", "t.bool"});
}

TEST_CASE("safetensors writes the bytes the reference writer does") {
  TempDir dir;
  const std::string path = dir.file("one.safetensors");
  io::save_safetensors(path, {{"attn.0", from_vector<float>({0, 1, 2, 3, 4, 5}, {1, 2, 3})}});
  // 64 bytes of JSON: already a multiple of 8, so no padding.
  Bytes expect = st_file(R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})", {});
  for (float f : {0.f, 1.f, 2.f, 3.f, 4.f, 5.f}) append(expect, f);
  CHECK(expect[0] == 64);
  CHECK(read_bytes(path) == expect);

  io::save_safetensors(path,
                       {{"c", from_vector<std::uint8_t>({1, 2, 3})},
                        {"a", scalar_tensor(1.5f)},
                        {"b", from_vector<std::int64_t>({-1, 258})}},
                       {{"format", "pt"}});
  // 194 bytes of JSON padded with 6 spaces to 200; i64 before f32 before u8.
  Bytes hand = st_file(std::string(R"({"__metadata__":{"format":"pt"},)") +
                           R"("b":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)" +
                           R"("a":{"dtype":"F32","shape":[],"data_offsets":[16,20]},)" +
                           R"("c":{"dtype":"U8","shape":[3],"data_offsets":[20,23]}})" + "      ",
                       {});
  CHECK(hand[0] == 200);
  append<std::int64_t>(hand, -1);
  append<std::int64_t>(hand, 258);
  append(hand, 1.5f);
  for (unsigned char c : {1, 2, 3}) hand.push_back(c);
  CHECK(read_bytes(path) == hand);
}

TEST_CASE("safetensors reads files in any header order and returns them in data order") {
  TempDir dir;
  Bytes data;
  append<std::int32_t>(data, 7);
  append<double>(data, -0.5);
  data.push_back(1);
  data.push_back(0);
  const std::string json =
      R"({"z":{"data_offsets":[12,14],"shape":[2],"dtype":"BOOL"}, "y" : {"dtype":"F64","shape":[1],"data_offsets":[4,12]},)"
      R"("x":{"dtype":"I32","shape":[1,1],"data_offsets":[0,4]}, "__metadata__": {}}   )";
  write_bytes(dir.file("h.safetensors"), st_file(json, data));
  const nn::NamedTensors t = io::load_safetensors(dir.file("h.safetensors"));
  REQUIRE(t.size() == 3);
  CHECK(t[0].first == "x");
  CHECK(t[0].second.item<std::int32_t>() == 7);
  CHECK(t[1].second.item<double>() == -0.5);
  CHECK(t[2].second.to_vector<bool>() == std::vector<bool>{true, false});
}

TEST_CASE("safetensors names with escapes and non-ASCII characters") {
  TempDir dir;
  const std::string odd =
      "gr\xc3\xb6\xc3\x9f"
      "e \"q\"\\\t\x01";  // UTF-8, quotes, backslash, controls
  io::save_safetensors(dir.file("n.safetensors"), {{odd, ones({1})}});
  const Bytes raw = read_bytes(dir.file("n.safetensors"));
  const std::string escaped =
      "\"gr\xc3\xb6\xc3\x9f"
      "e \\\"q\\\"\\\\\\t\\u0001\"";
  CHECK(std::string(raw.begin() + 8, raw.end()).find(escaped) == 1);
  CHECK(io::load_safetensors(dir.file("n.safetensors"))[0].first == odd);

  const std::string json = R"({"\u00fc\ud83d\ude00\/":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  write_bytes(dir.file("u.safetensors"), st_file(json, {5}));
  CHECK(io::load_safetensors(dir.file("u.safetensors"))[0].first == "\xc3\xbc\xf0\x9f\x98\x80/");

  const std::string deep = R"({"__metadata__":)" + std::string(100, '[') + std::string(100, ']') + "}";
  CHECK(load_error(dir, st_file(deep, {}), 8 + 16 + 64).find("nesting") != std::string::npos);
}

TEST_CASE("safetensors malformed lengths and JSON are IoErrors at their offsets") {
  TempDir dir;
  CHECK(load_error(dir, {1, 2, 3}, 3).find("8-byte") != std::string::npos);
  Bytes too_long = st_file("{}      ", {});
  too_long[0] = 200;
  CHECK(load_error(dir, too_long, 0).find("found 200") != std::string::npos);
  CHECK(load_error(dir, st_file(R"({"a":{"dtype":"F32",)", {}), 8 + 20).find("JSON header") != std::string::npos);
  CHECK(load_error(dir, st_file(R"({"a":1,})", {}), 8 + 7).find("object key") != std::string::npos);
  CHECK(load_error(dir, st_file("[]      ", {}), 8).find("JSON object") != std::string::npos);
  CHECK(load_error(dir, st_file("{\"\xff\":1}", {}), 8 + 2).find("UTF-8") != std::string::npos);
  CHECK(load_error(dir, st_file(R"({"__metadata__":{"k":1}})", {}), 8 + 21).find("string value") != std::string::npos);
  const std::string dup =
      R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  CHECK(load_error(dir, st_file(dup, {1, 2}), 8 + dup.rfind("{\"dtype")).find("repeats") != std::string::npos);
}

TEST_CASE("safetensors after the header's closing brace: JSON whitespace only, no NUL (as Python's reader)") {
  TempDir dir;
  const std::string json = R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  const std::string nul_text = std::string("\0 this is not JSON {{{", 22);
  // The issue's file: a NUL and then text that is not JSON, inside the header length.
  CHECK(load_error(dir, st_file(json + nul_text, {7, 9}), 8 + json.size()).find("NUL") != std::string::npos);
  CHECK(load_error(dir, st_file(json + std::string(3, '\0'), {7, 9}), 8 + json.size()).find("NUL") !=
        std::string::npos);
  CHECK(load_error(dir, st_file(json + std::string("  \0     ", 8), {7, 9}), 8 + json.size() + 2).find("NUL") !=
        std::string::npos);
  CHECK(load_error(dir, st_file(json + "  x", {7, 9}), 8 + json.size() + 2).find("JSON header") != std::string::npos);
  // Spaces (the writers' padding), tabs, CR and LF are JSON whitespace: Python's safetensors reads these.
  for (const std::string pad : {"", "      ", " \t\r\n"}) {
    CAPTURE(pad);
    const std::string path = dir.file("ok.safetensors");
    write_bytes(path, st_file(json + pad, {7, 9}));
    const nn::NamedTensors t = io::load_safetensors(path);
    REQUIRE(t.size() == 1);
    CHECK(values(t[0].second) == std::vector<double>{7, 9});
  }
}

TEST_CASE("safetensors bad entries: dtype, fields, shape vs offsets") {
  TempDir dir;
  auto entry_error = [&](const std::string& json, std::size_t data_bytes, const std::string& token) {
    CAPTURE(json);
    return load_error(dir, st_file(json, Bytes(data_bytes, 0)), 8 + json.find(token));
  };
  CHECK(entry_error(R"({"a":{"dtype":"I8","shape":[2],"data_offsets":[0,2]}})", 2, "\"I8\"").find("found \"I8\"") !=
        std::string::npos);
  CHECK(entry_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4, "[0,4]").find("spanning 8 bytes") !=
        std::string::npos);
  CHECK(entry_error(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, "-2").find("dimension") !=
        std::string::npos);
  CHECK(entry_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, "[8,0]").find("begin <= end") !=
        std::string::npos);
  CHECK(entry_error(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}})", 1, "1}}").find("\"x\"") !=
        std::string::npos);
  CHECK(entry_error(R"({"a":{"dtype":"U8","shape":[1]}})", 1, "{\"dtype").find("data_offsets") != std::string::npos);
  CHECK(entry_error(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8, "4294967296]")
            .find("2^62") != std::string::npos);
}

TEST_CASE("safetensors data offsets: out of range, overlapping, gaps, uncovered bytes") {
  TempDir dir;
  const std::string one = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})";
  const std::uint64_t base1 = 8 + one.size();
  // The file ends before a's data does: the offset is the end of the file.
  CHECK(load_error(dir, st_file(one, {1, 2}), base1 + 2).find("ends at byte") != std::string::npos);
  CHECK(load_error(dir, st_file(one, {1, 2, 3, 4, 5}), base1 + 4).find("found 1 more bytes") != std::string::npos);

  const std::string overlap =
      R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})";
  CHECK(load_error(dir, st_file(overlap, Bytes(5, 0)), 8 + overlap.size() + 3).find("overlap") != std::string::npos);

  const std::string gap =
      R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})";
  CHECK(load_error(dir, st_file(gap, Bytes(5, 0)), 8 + gap.size() + 2).find("[2, 3) belong to no tensor") !=
        std::string::npos);
}

TEST_CASE("safetensors save rejects duplicate, empty and reserved names") {
  TempDir dir;
  const std::string p = dir.file("x.safetensors");
  CHECK(kiln_test::message_of<ValueError>([&] {
          io::save_safetensors(p, {{"w", zeros({1})}, {"w", zeros({2})}});
        }).find("appears twice") != std::string::npos);
  CHECK_THROWS_AS(io::save_safetensors(p, {{"", zeros({1})}}), ValueError);
  CHECK_THROWS_AS(io::save_safetensors(p, {{"__metadata__", zeros({1})}}), ValueError);
  CHECK_THROWS_AS(io::save_safetensors(p, {{"u", Tensor()}}), ValueError);
  CHECK_FALSE(fs::exists(p));
  CHECK_THROWS_AS(io::save_safetensors(dir.file("missing-dir/x.safetensors"), {{"w", zeros({1})}}), IoError);
}

TEST_CASE("io copy_into lists every mismatch in one ValueError and copies nothing") {
  const nn::NamedTensors from{{"0.weight", ones({512, 784})},
                              {"0.bias", ones({512})},
                              {"fc.bias", ones({10})},
                              {"1.scale", ones({3}, {.dtype = DType::f64})}};
  Tensor w = zeros({256, 784}), b = zeros({512}), missing = zeros({10, 512}), scale = zeros({3});
  const nn::NamedTensors into{{"0.weight", w}, {"0.bias", b}, {"3.weight", missing}, {"1.scale", scale}};
  const std::string msg = kiln_test::message_of<ValueError>([&] { io::copy_into(from, into, "model"); });
  CHECK(msg ==
        "[io] model: missing 3.weight; unexpected fc.bias; 0.weight: shape (512,784) in file, (256,784) expected; "
        "1.scale: dtype f64 in file, f32 expected");
  CHECK(sum(b).item<float>() == 0);  // nothing copied

  Tensor p = zeros({2, 2}, {.requires_grad = true});
  io::copy_into({{"p", full({2, 2}, 3.0)}}, {{"p", p}}, "model");
  CHECK(p.to_vector<float>() == std::vector<float>(4, 3.0f));
  CHECK(p.requires_grad());
}

TEST_CASE("io checkpoint round trip of a model and its optimizer state") {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  Generator g1(1), g2(2);
  nn::Sequential a{nn::Linear(4, 3, true, &g1), nn::ReLU(), nn::Linear(3, 2, true, &g1)};
  optim::SGD opt_a(a.parameters(), {.lr = 0.1, .momentum = 0.9});
  const Tensor x = from_vector<float>({1, -2, 3, 0.5, 0, 1, -1, 2}, {2, 4});
  sum(a(x)).backward();
  opt_a.step();
  opt_a.zero_grad();
  io::save_checkpoint(path, a, &opt_a);

  io::Metadata meta;
  const nn::NamedTensors file = io::load_safetensors(path, &meta);
  CHECK(meta.at("format") == "kiln-checkpoint");
  CHECK(std::any_of(file.begin(), file.end(), [](const auto& p) { return p.first == "model.0.weight"; }));
  CHECK(std::any_of(file.begin(), file.end(), [](const auto& p) { return p.first.rfind("optim.", 0) == 0; }));

  nn::Sequential b{nn::Linear(4, 3, true, &g2), nn::ReLU(), nn::Linear(3, 2, true, &g2)};
  optim::SGD opt_b(b.parameters(), {.lr = 0.1, .momentum = 0.9});
  io::load_checkpoint(path, b, &opt_b);
  CHECK(opt_b.steps() == opt_a.steps());
  const nn::NamedTensors sa = a.state(), sb = b.state();
  REQUIRE(sa.size() == sb.size());
  for (std::size_t i = 0; i < sa.size(); ++i) CHECK(values(sa[i].second) == values(sb[i].second));
  // Same state, same gradient: the next step lands on the same weights.
  sum(a(x)).backward();
  sum(b(x)).backward();
  opt_a.step();
  opt_b.step();
  CHECK(values(a.parameters()[0]) == values(b.parameters()[0]));

  nn::Sequential wrong{nn::Linear(4, 5), nn::ReLU(), nn::Linear(5, 2)};
  const std::string msg = kiln_test::message_of<ValueError>([&] { io::load_checkpoint(path, wrong); });
  CHECK(msg.find("[io] model: 0.weight: shape (3,4) in file, (5,4) expected") == 0);

  // A bare state dict (no metadata, as PyTorch's save_file writes by default) loads the model alone.
  nn::Sequential c{nn::Linear(4, 3, true, &g2), nn::ReLU(), nn::Linear(3, 2, true, &g2)};
  optim::SGD opt_c(c.parameters(), {.lr = 0.1, .momentum = 0.9});
  io::save_safetensors(dir.file("plain.safetensors"), a.state());
  io::load_checkpoint(dir.file("plain.safetensors"), c, &opt_c);
  CHECK(values(c.parameters()[0]) == values(a.parameters()[0]));
  CHECK(opt_c.steps() == 0);
  io::save_safetensors(dir.file("other.safetensors"), a.state(), {{"format", "flax"}});
  CHECK_THROWS_AS(io::load_checkpoint(dir.file("other.safetensors"), c), IoError);
}

TEST_CASE("io checkpoint extras: tensors and metadata beside the model, ignored unless asked for") {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  Generator g(3);
  nn::Sequential a{nn::Linear(4, 3, true, &g)};
  optim::Adam opt_a(a.parameters());
  io::CheckpointExtras extras{{{"scaler.scale", full({}, 1024.0)}, {"order", arange(0, 5, 1, {.dtype = DType::i64})}},
                              {{"trainer", R"({"epoch":2})"}}};
  io::save_checkpoint(path, a, &opt_a, extras);

  io::Metadata meta;
  const nn::NamedTensors file = io::load_safetensors(path, &meta);
  CHECK(meta == io::Metadata{{"format", "kiln-checkpoint"}, {"trainer", R"({"epoch":2})"}});
  CHECK(std::any_of(file.begin(), file.end(), [](const auto& p) { return p.first == "extra.scaler.scale"; }));
  CHECK(io::checkpoint_metadata(path) == io::Metadata{{"trainer", R"({"epoch":2})"}});

  nn::Sequential b{nn::Linear(4, 3)};
  optim::Adam opt_b(b.parameters());
  io::CheckpointExtras back;
  io::load_checkpoint(path, b, &opt_b, &back);
  CHECK(values(b.parameters()[0]) == values(a.parameters()[0]));
  CHECK(back.metadata == io::Metadata{{"trainer", R"({"epoch":2})"}});
  REQUIRE(back.tensors.size() == 2);
  for (const auto& entry : back.tensors) {
    const std::string& name = entry.first;  // not a structured binding: clang 14 cannot capture one
    const Tensor& t = entry.second;
    CAPTURE(name);
    if (name == "order") {
      CHECK(t.to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1, 2, 3, 4});
    } else {
      CHECK(name == "scaler.scale");
      CHECK(t.item<float>() == 1024.0f);
    }
  }
  nn::Sequential c{nn::Linear(4, 3)};
  io::load_checkpoint(path, c);  // extras not asked for: a model checkpoint like any other
  CHECK(values(c.parameters()[0]) == values(a.parameters()[0]));

  // A checkpoint without extras gives none; "format" is the checkpoint's own key.
  io::save_checkpoint(path, a, &opt_a);
  io::load_checkpoint(path, b, &opt_b, &back);
  CHECK(back.tensors.empty());
  CHECK(back.metadata.empty());
  const std::string msg = kiln_test::message_of<ValueError>([&] {
    io::save_checkpoint(dir.file("f.safetensors"), a, nullptr, {{}, {{"format", "mine"}}});
  });
  CHECK(msg.find("the metadata key \"format\" is the checkpoint's own") != std::string::npos);
  CHECK_FALSE(fs::exists(dir.file("f.safetensors")));
  CHECK_THROWS_AS(io::checkpoint_metadata(dir.file("missing.safetensors")), IoError);
}

TEST_CASE("safetensors files read in Python's safetensors (skipped without it)") {
  if (std::system("python3 -c 'import safetensors.numpy' >/dev/null 2>&1") != 0) {
    MESSAGE("skipped: python3 cannot import safetensors.numpy");
    return;
  }
  TempDir dir;
  const std::string path = dir.file("py.safetensors");
  io::save_safetensors(path,
                       {{"w", from_vector<float>({1.5f, -2, 3, 4}, {2, 2})},
                        {"n", from_vector<std::int64_t>({7, -8})},
                        {"h", from_vector<double>({0.25}).to(DType::f16)},
                        {"m", from_vector<bool>({true, false, true})}},
                       {{"format", "kiln"}});
  const std::string script =
      "from safetensors.numpy import load_file\n"
      "from safetensors import safe_open\n"
      "d = load_file('" +
      path +
      "')\n"
      "assert d['w'].shape == (2, 2) and d['w'].dtype.name == 'float32' and d['w'].tolist() == [[1.5, -2.0], [3.0, "
      "4.0]]\n"
      "assert d['n'].tolist() == [7, -8] and d['h'].tolist() == [0.25] and d['m'].tolist() == [True, False, True]\n"
      "with safe_open('" +
      path + "', framework='numpy') as f: assert f.metadata() == {'format': 'kiln'}\n";
  const std::string py = dir.file("check.py");
  std::ofstream(py) << script;
  CHECK(std::system(("python3 " + py).c_str()) == 0);
}

TEST_CASE("safetensors a shape whose strides pass int64 is an IoError naming the tensor") {
  // 0 elements, so the byte count checks passed, but the strides of the other dims overflow.
  TempDir dir;
  const std::string json =
      R"({"w":{"dtype":"F32","shape":[0,4611686018427387903,4611686018427387903],"data_offsets":[0,0]}})";
  const std::string msg = load_error(dir, st_file(json, {}), 8 + json.find("{\"dtype"));
  CHECK(msg.find("tensor \"w\"") != std::string::npos);
  CHECK(msg.find("int64") != std::string::npos);
}
