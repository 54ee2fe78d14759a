// IDX files: round trips raw and gzip for every dtype write_idx takes, bytes written by
// hand for the types only the reader knows, every malformed-file case with its offset,
// and the MNIST loader on small synthetic files and (when present) the real ones.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "error_message.h"
#include "kiln/data/idx.h"
#include "kiln/data/mnist.h"
#include "kiln/kiln.h"
#include "temp_dir.h"
#include "test_values.h"

using namespace kiln;
namespace fs = std::filesystem;
using Bytes = std::vector<unsigned char>;

namespace {
using kiln_test::read_bytes;
using kiln_test::write_bytes;

using kiln_test::TempDir;



// An IDX header: 00 00 type ndim, then big-endian dims.
Bytes header(unsigned char type, const std::vector<std::uint32_t>& dims) {
  Bytes b{0, 0, type, static_cast<unsigned char>(dims.size())};
  for (std::uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(d >> s));
  return b;
}

// A gzip member holding `raw` in stored (uncompressed) deflate blocks, so a test sets every
// byte of the IDX stream, including headers that lie.
Bytes gzip_stored(const Bytes& raw) {
  Bytes b{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff};
  std::size_t at = 0;
  do {
    const std::size_t n = std::min<std::size_t>(raw.size() - at, 65535);
    b.push_back(at + n == raw.size() ? 1 : 0);  // BFINAL, BTYPE 00 (stored)
    for (std::size_t v : {n, ~n & 0xFFFF}) {
      b.push_back(static_cast<unsigned char>(v));
      b.push_back(static_cast<unsigned char>(v >> 8));
    }
    b.insert(b.end(), raw.begin() + static_cast<std::ptrdiff_t>(at), raw.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  } while (at < raw.size());
  std::uint32_t crc = ~0u;
  for (unsigned char c : raw) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  for (std::uint32_t v : {~crc, static_cast<std::uint32_t>(raw.size())})
    for (int s = 0; s < 32; s += 8) b.push_back(static_cast<unsigned char>(v >> s));
  return b;
}

// The IoError read_idx throws for `bytes`, whose offset must be `offset`; returns its message.
std::string idx_error(const TempDir& dir, const Bytes& bytes, std::uint64_t offset,
                      const std::string& name = "bad.idx") {
  const std::string path = dir.file(name);
  write_bytes(path, bytes);
  try {
    data::read_idx(path);
  } catch (const IoError& e) {
    CHECK(e.offset() == offset);
    CHECK(e.file() == path);
    return e.what();
  }
  FAIL("read_idx accepted a malformed file");
  return {};
}

}  // namespace

TEST_CASE("idx round trip of u8, i32, f32 and f64, raw and gzip") {
  TempDir dir;
  const Tensor values = from_vector<double>({0, 1, -2.5, 3.25, 127, -128, 1e10, -7e-3, 42, 0.5, -1, 255}, {2, 3, 2});
  for (DType dt : {DType::u8, DType::i32, DType::f32, DType::f64}) {
    const Tensor t = dt == DType::u8 ? abs(values).to(DType::i64).to(DType::u8) : values.to(dt);
    for (bool gz : {false, true}) {
      CAPTURE(dtype_name(dt));
      CAPTURE(gz);
      const std::string path = dir.file("t.idx");
      data::write_idx(path, t, gz);
      const Bytes raw = read_bytes(path);
      REQUIRE(raw.size() >= 2);
      CHECK((raw[0] == 0x1f && raw[1] == 0x8b) == gz);
      const Tensor back = data::read_idx(path);
      CHECK(back.dtype() == dt);
      CHECK(back.shape() == Shape{2, 3, 2});
      CHECK(back.to(DType::f64).to_vector<double>() == t.to(DType::f64).to_vector<double>());
    }
  }
}

TEST_CASE("idx write_idx lays out the header and big-endian data byte for byte") {
  TempDir dir;
  const std::string path = dir.file("t.idx");
  data::write_idx(path, from_vector<std::int32_t>({0x01020304, -2}, {1, 2}));
  Bytes expect = header(0x0C, {1, 2});
  for (unsigned char c : {0x01, 0x02, 0x03, 0x04, 0xFF, 0xFF, 0xFF, 0xFE}) expect.push_back(c);
  CHECK(read_bytes(path) == expect);

  data::write_idx(path, from_vector<float>({1.0f}));
  CHECK(read_bytes(path) == Bytes{0, 0, 0x0D, 1, 0, 0, 0, 1, 0x3F, 0x80, 0, 0});
}

TEST_CASE("idx reads i8 and i16 files as i32 with their signs") {
  TempDir dir;
  Bytes i8 = header(0x09, {3});
  for (unsigned char c : {0x7F, 0x80, 0xFF}) i8.push_back(c);
  write_bytes(dir.file("i8.idx"), i8);
  const Tensor a = data::read_idx(dir.file("i8.idx"));
  CHECK(a.dtype() == DType::i32);
  CHECK(a.to_vector<std::int32_t>() == std::vector<std::int32_t>{127, -128, -1});

  Bytes i16 = header(0x0B, {2, 1});
  for (unsigned char c : {0x80, 0x00, 0x01, 0x02}) i16.push_back(c);
  write_bytes(dir.file("i16.idx"), i16);
  const Tensor b = data::read_idx(dir.file("i16.idx"));
  CHECK(b.shape() == Shape{2, 1});
  CHECK(b.to_vector<std::int32_t>() == std::vector<std::int32_t>{-32768, 258});
}

TEST_CASE("idx detects gzip by its magic, not by the file name") {
  TempDir dir;
  const Tensor t = from_vector<std::uint8_t>({1, 2, 3, 4}, {2, 2});
  data::write_idx(dir.file("compressed.idx"), t, true);
  data::write_idx(dir.file("plain.gz"), t, false);
  CHECK(data::read_idx(dir.file("compressed.idx")).to_vector<std::uint8_t>() == std::vector<std::uint8_t>{1, 2, 3, 4});
  CHECK(data::read_idx(dir.file("plain.gz")).to_vector<std::uint8_t>() == std::vector<std::uint8_t>{1, 2, 3, 4});
}

TEST_CASE("idx truncated data names the offset, the bytes expected and the bytes found") {
  TempDir dir;
  Bytes b = header(0x08, {10, 28, 28});
  b.resize(b.size() + 1200, 7);
  const std::string msg = idx_error(dir, b, 16, "t10k-images-idx3-ubyte");
  CHECK(msg.find("t10k-images-idx3-ubyte") != std::string::npos);
  CHECK(msg.find("at offset 16") != std::string::npos);
  CHECK(msg.find("expected 7840 bytes of u8 data for shape (10,28,28)") != std::string::npos);
  CHECK(msg.find("ends after 1200 bytes") != std::string::npos);

  Bytes f = header(0x0D, {4});
  f.resize(f.size() + 10);
  CHECK(idx_error(dir, f, 8).find("expected 16 bytes of f32 data") != std::string::npos);
}

TEST_CASE("idx truncated gzip stream is an IoError that says the stream is cut short") {
  TempDir dir;
  Generator g(3);
  const std::string good = dir.file("good.idx.gz");
  data::write_idx(good, randint(0, 256, {64, 28, 28}, {.dtype = DType::i32}, &g).to(DType::u8), true);
  Bytes gz = read_bytes(good);
  gz.resize(gz.size() / 2);
  const std::string msg = idx_error(dir, gz, 16, "cut.idx.gz");
  CHECK(msg.find("expected 50176 bytes of u8 data") != std::string::npos);
  CHECK(msg.find("decompressed bytes") != std::string::npos);
  CHECK(msg.find("cut short") != std::string::npos);

  // Data complete but the 8-byte gzip trailer (CRC, size) missing.
  Bytes no_trailer = read_bytes(good);
  no_trailer.resize(no_trailer.size() - 8);
  CHECK(idx_error(dir, no_trailer, 16 + 50176, "trailer.idx.gz").find("trailer") != std::string::npos);
}

TEST_CASE("idx a large gzip file cut by 1 to 8 bytes (its trailer) is an IoError") {
  // Reads of 2 MiB or more went around zlib's trailer check: a cut trailer passed on large files.
  TempDir dir;
  constexpr std::int64_t kImages = 6000;  // 4.7 MB of pixels
  std::vector<std::uint8_t> px(static_cast<std::size_t>(kImages * 784));
  for (std::size_t k = 0; k < px.size(); ++k) px[k] = static_cast<std::uint8_t>((k * 7 + k / 784) % 251);
  const std::string good = dir.file("big.idx.gz");
  data::write_idx(good, from_vector<std::uint8_t>(px, {kImages, 28, 28}), true);
  REQUIRE(data::read_idx(good).shape() == Shape{kImages, 28, 28});
  const Bytes gz = read_bytes(good);
  for (std::size_t cut = 1; cut <= 8; ++cut) {
    CAPTURE(cut);
    const Bytes b(gz.begin(), gz.end() - static_cast<std::ptrdiff_t>(cut));
    CHECK(idx_error(dir, b, 16 + px.size(), "cut.idx.gz").find("trailer") != std::string::npos);
  }
}

TEST_CASE("idx bytes after a complete gzip stream are an IoError at their compressed offset") {
  TempDir dir;
  const std::string good = dir.file("good.idx.gz");
  for (std::int64_t n : {std::int64_t{4}, std::int64_t{6000}}) {  // one read, and reads past 2 MiB
    CAPTURE(n);
    data::write_idx(good, zeros({n, 28, 28}, {.dtype = DType::u8}), true);
    const Bytes gz = read_bytes(good);
    Bytes garbage = gz;
    for (unsigned char c : {'x', 'y', 'z'}) garbage.push_back(c);
    const std::string msg = idx_error(dir, garbage, gz.size(), "garbage.idx.gz");
    CHECK(msg.find("found 3 bytes after the gzip stream") != std::string::npos);
    Bytes zero = gz;
    zero.push_back(0);
    CHECK(idx_error(dir, zero, gz.size(), "zero.idx.gz").find("after the gzip stream") != std::string::npos);
    Bytes twice = gz;
    twice.insert(twice.end(), gz.begin(), gz.end());
    CHECK(idx_error(dir, twice, gz.size(), "twice.idx.gz").find("after the gzip stream") != std::string::npos);
  }
}

TEST_CASE("idx a gzip header whose size no gzip file of that length can hold fails before reading") {
  TempDir dir;
  // Stored blocks read back as written, so the helper itself is checked first.
  Bytes ok = header(0x08, {2, 3});
  for (unsigned char c : {1, 2, 3, 4, 5, 6}) ok.push_back(c);
  write_bytes(dir.file("ok.gz"), gzip_stored(ok));
  CHECK(data::read_idx(dir.file("ok.gz")).to_vector<std::uint8_t>() == std::vector<std::uint8_t>{1, 2, 3, 4, 5, 6});

  // 78 MB promised by a 40-byte file: deflate expands at most 1032:1.
  Bytes lie = header(0x08, {100000, 28, 28});
  lie.resize(lie.size() + 10, 1);
  const Bytes gz = gzip_stored(lie);
  const std::string msg = idx_error(dir, gz, 16, "lie.idx.gz");
  CHECK(msg.find("expected 78400000 bytes of u8 data for shape (100000,28,28)") != std::string::npos);
  CHECK(msg.find("at most " + std::to_string(gz.size() * 1032)) != std::string::npos);
}

TEST_CASE("idx corrupt gzip data is an IoError naming zlib's complaint") {
  TempDir dir;
  const std::string good = dir.file("good.idx.gz");
  data::write_idx(good, zeros({100, 100}, {.dtype = DType::u8}), true);
  Bytes gz = read_bytes(good);
  for (std::size_t i = 12; i < gz.size() - 8; ++i) gz[i] ^= 0x5A;
  write_bytes(dir.file("corrupt.gz"), gz);
  const std::string msg = kiln_test::message_of<IoError>([&] { data::read_idx(dir.file("corrupt.gz")); });
  CHECK(msg.find("gzip") != std::string::npos);
}

TEST_CASE("idx trailing bytes after the data are an IoError at the end of the data") {
  TempDir dir;
  Bytes b = header(0x08, {2, 2});
  for (unsigned char c : {1, 2, 3, 4, 9, 9, 9}) b.push_back(c);
  const std::string msg = idx_error(dir, b, 12 + 4);
  CHECK(msg.find("found 3 bytes after it") != std::string::npos);
}

TEST_CASE("idx malformed headers: magic, type, ndim, dims") {
  TempDir dir;
  auto with_data = [](Bytes b, std::size_t n) {
    b.resize(b.size() + n);
    return b;
  };
  CHECK(idx_error(dir, {}, 0).find("ends after 0 bytes") != std::string::npos);
  CHECK(idx_error(dir, {0, 0}, 2).find("4-byte IDX header") != std::string::npos);
  CHECK(idx_error(dir, with_data({1, 0, 8, 1, 0, 0, 0, 1}, 1), 0).find("found 0x01") != std::string::npos);
  CHECK(idx_error(dir, with_data({0, 0x80, 8, 1, 0, 0, 0, 1}, 1), 1).find("found 0x80") != std::string::npos);
  CHECK(idx_error(dir, with_data({0, 0, 0x0A, 1, 0, 0, 0, 1}, 1), 2).find("type code") != std::string::npos);
  CHECK(idx_error(dir, {0, 0, 8, 0}, 3).find("1 to 8 dimensions, found 0") != std::string::npos);
  CHECK(idx_error(dir, {0, 0, 8, 9}, 3).find("found 9") != std::string::npos);
  CHECK(idx_error(dir, {0, 0, 8, 2, 0, 0, 0, 5, 0}, 9).find("2 big-endian u32 dimensions") != std::string::npos);
  CHECK(idx_error(dir, with_data(header(0x08, {3, 0}), 0), 8).find("dimension 1 > 0, found 0") != std::string::npos);
  // 2^16 * 2^16 * 2^32 elements pass 2^48 bytes at the third dim (offset 4 + 2*4).
  CHECK(idx_error(dir, header(0x08, {0xFFFFu, 0xFFFFu, 0xFFFFFFFFu}), 12).find("overflows") != std::string::npos);
  // Eight dims are accepted.
  write_bytes(dir.file("eight.idx"), with_data(header(0x08, {1, 2, 1, 1, 1, 1, 1, 3}), 6));
  CHECK(data::read_idx(dir.file("eight.idx")).shape() == Shape{1, 2, 1, 1, 1, 1, 1, 3});
}

TEST_CASE("idx a missing file is an IoError; write_idx rejects dtypes and shapes IDX cannot hold") {
  TempDir dir;
  CHECK(kiln_test::message_of<IoError>([&] { data::read_idx(dir.file("nope")); }).find("readable file") !=
        std::string::npos);
  CHECK(kiln_test::message_of<DTypeError>([&] {
          data::write_idx(dir.file("h"), zeros({2}, {.dtype = DType::f16}));
        }).find("[idx]") == 0);
  CHECK_THROWS_AS(data::write_idx(dir.file("h"), zeros({2}, {.dtype = DType::i64})), DTypeError);
  CHECK_THROWS_AS(data::write_idx(dir.file("h"), zeros({2}, {.dtype = DType::boolean})), DTypeError);
  CHECK_THROWS_AS(data::write_idx(dir.file("h"), scalar_tensor(1.0)), ShapeError);
  CHECK_THROWS_AS(data::write_idx(dir.file("h"), zeros({2, 0})), ShapeError);
  CHECK_THROWS_AS(data::write_idx(dir.file("no-such-dir/h"), zeros({2})), IoError);
}

// ---- MNIST ----

namespace {

// A small MNIST-shaped set: pixel k of the file is k % 251, label i is i % 10.
void write_mnist(const TempDir& dir, std::int64_t n_train, std::int64_t n_test, bool gz) {
  auto cycle = [](std::int64_t n, int period, Shape shape) {
    std::vector<std::uint8_t> v(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i % period);
    return from_vector<std::uint8_t>(v, shape);
  };
  auto images = [&](std::int64_t n) { return cycle(n * 784, 251, {n, 28, 28}); };
  auto labels = [&](std::int64_t n) { return cycle(n, 10, {n}); };
  const std::string sfx = gz ? ".gz" : "";
  data::write_idx(dir.file("train-images-idx3-ubyte" + sfx), images(n_train), gz);
  data::write_idx(dir.file("train-labels-idx1-ubyte" + sfx), labels(n_train), gz);
  data::write_idx(dir.file("t10k-images-idx3-ubyte" + sfx), images(n_test), gz);
  data::write_idx(dir.file("t10k-labels-idx1-ubyte" + sfx), labels(n_test), gz);
}

// The IoError load_mnist throws for `dir`; fails the test when it throws none.
IoError mnist_error(const TempDir& dir) {
  try {
    data::load_mnist(dir.path().string());
  } catch (const IoError& e) {
    return e;
  }
  FAIL("load_mnist accepted a malformed set of files");
  return IoError("", 0, "");
}

}  // namespace

TEST_CASE("mnist file names list raw before .gz for each of the four files") {
  const std::vector<std::string> names = data::mnist_file_names();
  REQUIRE(names.size() == 8);
  CHECK(names[0] == "train-images-idx3-ubyte");
  CHECK(names[1] == "train-images-idx3-ubyte.gz");
  CHECK(names[7] == "t10k-labels-idx1-ubyte.gz");
}

TEST_CASE("mnist loads synthetic files, raw or gzip, with i64 labels") {
  for (bool gz : {false, true}) {
    CAPTURE(gz);
    TempDir dir;
    CHECK_FALSE(data::has_mnist(dir.path().string()));
    write_mnist(dir, 30, 12, gz);
    CHECK(data::has_mnist(dir.path().string()));
    const data::Mnist m = data::load_mnist(dir.path().string());
    CHECK(m.train_images.dtype() == DType::u8);
    CHECK(m.train_images.shape() == Shape{30, 28, 28});
    CHECK(m.test_images.shape() == Shape{12, 28, 28});
    CHECK(m.train_labels.dtype() == DType::i64);
    CHECK(m.test_labels.shape() == Shape{12});
    CHECK(m.train_labels.to_vector<std::int64_t>()[13] == 3);
    CHECK(m.train_images.to_vector<std::uint8_t>()[300] == 300 % 251);
  }
}

TEST_CASE("mnist prefers the raw file when both raw and .gz are present") {
  TempDir dir;
  write_mnist(dir, 10, 10, true);
  data::write_idx(dir.file("t10k-labels-idx1-ubyte"), full({10}, 9).to(DType::u8));
  const data::Mnist m = data::load_mnist(dir.path().string());
  CHECK(m.test_labels.to_vector<std::int64_t>() == std::vector<std::int64_t>(10, 9));
  CHECK(m.train_labels.to_vector<std::int64_t>()[1] == 1);
}

TEST_CASE("mnist cross-checks: missing files, counts, image size, label range") {
  TempDir dir;
  write_mnist(dir, 20, 10, false);
  fs::remove(dir.file("t10k-images-idx3-ubyte"));
  fs::remove(dir.file("train-labels-idx1-ubyte"));
  CHECK_FALSE(data::has_mnist(dir.path().string()));
  const std::string missing = kiln_test::message_of<IoError>([&] { data::load_mnist(dir.path().string()); });
  CHECK(missing.find("missing train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz]") != std::string::npos);

  write_mnist(dir, 20, 10, false);
  data::write_idx(dir.file("train-labels-idx1-ubyte"), zeros({19}, {.dtype = DType::u8}));
  const IoError count = mnist_error(dir);
  CHECK(count.file() == dir.file("train-labels-idx1-ubyte"));
  CHECK(count.offset() == 4);
  CHECK(std::string(count.what()).find("expected 20 labels") != std::string::npos);

  data::write_idx(dir.file("train-labels-idx1-ubyte"), [] {
    std::vector<std::uint8_t> v(20, 1);
    v[5] = 10;
    return from_vector<std::uint8_t>(v);
  }());
  const IoError label = mnist_error(dir);
  CHECK(label.offset() == 8 + 5);
  CHECK(std::string(label.what()).find("found 10") != std::string::npos);

  data::write_idx(dir.file("train-labels-idx1-ubyte"), zeros({20}, {.dtype = DType::u8}));
  data::write_idx(dir.file("t10k-images-idx3-ubyte"), zeros({10, 28, 27}, {.dtype = DType::u8}));
  const IoError size = mnist_error(dir);
  CHECK(size.file() == dir.file("t10k-images-idx3-ubyte"));
  CHECK(std::string(size.what()).find("28x28") != std::string::npos);
}

TEST_CASE("mnist image and label counts are compared from the headers, before any payload is read") {
  // Found only after inflating every image: a 1.5 MB .gz grew to 3.2 GB before the mismatch showed.
  TempDir dir;
  write_mnist(dir, 3, 3, false);
  Bytes lie = header(0x08, {100000, 28, 28});
  lie.resize(lie.size() + 3 * 784);  // the data of 3 images, so the file is also too short
  write_bytes(dir.file("train-images-idx3-ubyte"), lie);
  const IoError e = mnist_error(dir);
  CHECK(e.file() == dir.file("train-labels-idx1-ubyte"));
  CHECK(e.offset() == 4);
  CHECK(std::string(e.what()).find("expected 100000 labels") != std::string::npos);
  // The header alone, as load_mnist reads it first.
  const data::IdxHeader h = data::read_idx_header(dir.file("train-images-idx3-ubyte"));
  CHECK(h.dtype == DType::u8);
  CHECK(h.shape == Shape{100000, 28, 28});
  CHECK(h.data_offset == 16);
}

TEST_CASE("mnist the real files: counts, first labels, label histogram, known pixels") {
  const char* env = std::getenv("KILN_MNIST_DIR");
  const std::string dir = env && *env ? env : std::string(KILN_SOURCE_DIR) + "/../shared/data/mnist";
  if (!data::has_mnist(dir)) {
    MESSAGE("skipped: no MNIST files in " << dir << " (set KILN_MNIST_DIR)");
    return;
  }
  const data::Mnist m = data::load_mnist(dir);
  REQUIRE(m.train_images.shape() == Shape{60000, 28, 28});
  REQUIRE(m.test_images.shape() == Shape{10000, 28, 28});
  REQUIRE(m.train_labels.shape() == Shape{60000});
  REQUIRE(m.test_labels.shape() == Shape{10000});
  const auto train = m.train_labels.to_vector<std::int64_t>(), test = m.test_labels.to_vector<std::int64_t>();
  CHECK(std::vector<std::int64_t>(train.begin(), train.begin() + 10) ==
        std::vector<std::int64_t>{5, 0, 4, 1, 9, 2, 1, 3, 1, 4});
  CHECK(std::vector<std::int64_t>(test.begin(), test.begin() + 10) ==
        std::vector<std::int64_t>{7, 2, 1, 0, 4, 1, 4, 9, 5, 9});
  std::vector<std::int64_t> counts(10);
  for (std::int64_t l : test) ++counts[static_cast<std::size_t>(l)];
  CHECK(counts == std::vector<std::int64_t>{980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009});
  const auto first = narrow(m.train_images, 0, 0, 1).to_vector<std::uint8_t>();
  std::int64_t sum = 0;
  for (int i = 0; i < 784; ++i) sum += first[static_cast<std::size_t>(i)];
  CHECK(sum == 27525);
  CHECK(first[14 * 28 + 14] == 240);
}
