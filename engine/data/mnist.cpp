// The four MNIST files, raw or gzip, with the cross-checks their headers allow.
#include "kiln/data/mnist.h"

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/data/idx.h"
#include "kiln/error.h"

namespace kiln::data {

namespace {

namespace fs = std::filesystem;

constexpr const char* kStems[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                                   "t10k-labels-idx1-ubyte"};

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

// The path of one file: raw before .gz (a raw copy is the one someone unpacked on purpose).
std::string find(const std::string& dir, const std::string& stem) {
  for (const char* suffix : {"", ".gz"}) {
    const fs::path p = fs::path(dir) / (stem + suffix);
    if (is_file(p)) return p.string();
  }
  return {};
}

// IDX headers: images are 00 00 08 03 with dims (N, 28, 28), labels 00 00 08 01 with dims (N).
IdxHeader check_images(const std::string& path) {
  IdxHeader h = read_idx_header(path);
  if (h.dtype != DType::u8)
    throw IoError(path, 2,
                  "expected MNIST images of type 0x08 (u8), found " + std::string(dtype_name(h.dtype)) + " data");
  if (h.shape.size() != 3)
    throw IoError(path, 3, "expected MNIST images with 3 dimensions, found shape " + shape_str(h.shape));
  if (h.shape[1] != 28 || h.shape[2] != 28)
    throw IoError(path, 8, "expected MNIST images of 28x28 pixels, found shape " + shape_str(h.shape));
  return h;
}

void check_labels(const std::string& path, std::int64_t images, const std::string& images_path) {
  const IdxHeader h = read_idx_header(path);
  if (h.dtype != DType::u8)
    throw IoError(path, 2,
                  "expected MNIST labels of type 0x08 (u8), found " + std::string(dtype_name(h.dtype)) + " data");
  if (h.shape.size() != 1)
    throw IoError(path, 3, "expected MNIST labels with 1 dimension, found shape " + shape_str(h.shape));
  if (h.shape[0] != images)
    throw IoError(path, 4,
                  "expected " + std::to_string(images) + " labels, one per image of " +
                      fs::path(images_path).filename().string() + ", found " + std::to_string(h.shape[0]));
}

Tensor read_labels(const std::string& path) {
  const Tensor t = read_idx(path);
  const auto* p = static_cast<const std::uint8_t*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i)
    if (p[i] > 9)
      throw IoError(path, 8 + static_cast<std::uint64_t>(i),
                    "expected a label in 0..9 for image " + std::to_string(i) + ", found " + std::to_string(p[i]));
  return t.to(DType::i64);
}

}  // namespace

std::vector<std::string> mnist_file_names() {
  std::vector<std::string> names;
  for (const char* stem : kStems) {
    names.push_back(stem);
    names.push_back(std::string(stem) + ".gz");
  }
  return names;
}

bool has_mnist(const std::string& dir) {
  for (const char* stem : kStems)
    if (find(dir, stem).empty()) return false;
  return true;
}

Mnist load_mnist(const std::string& dir) {
  std::string paths[4], missing;
  for (int i = 0; i < 4; ++i) {
    paths[i] = find(dir, kStems[i]);
    if (paths[i].empty()) missing += std::string(missing.empty() ? "" : ", ") + kStems[i] + "[.gz]";
  }
  if (!missing.empty())
    throw IoError(dir, 0, "expected the four MNIST files in this directory (raw or .gz); missing " + missing);
  // Headers first: a file that lies about its count is caught before any payload is inflated.
  for (int i = 0; i < 4; i += 2) check_labels(paths[i + 1], check_images(paths[i]).shape[0], paths[i]);
  Mnist m;
  m.train_images = read_idx(paths[0]);
  m.train_labels = read_labels(paths[1]);
  m.test_images = read_idx(paths[2]);
  m.test_labels = read_labels(paths[3]);
  return m;
}

}  // namespace kiln::data
