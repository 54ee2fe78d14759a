#pragma once
// The four MNIST IDX files: train-images-idx3-ubyte, train-labels-idx1-ubyte,
// t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, each raw or with a .gz suffix.
#include <optional>
#include <string>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::data {

struct Mnist {
  Tensor train_images, train_labels;  // u8 (60000, 28, 28), i64 (60000)
  Tensor test_images, test_labels;    // u8 (10000, 28, 28), i64 (10000)
};

// The file names this loader accepts for each of the four files, in lookup order.
std::vector<std::string> mnist_file_names();
// True when `dir` holds all four (raw or .gz).
bool has_mnist(const std::string& dir);
// Reads and cross-checks the four files (image dims 28x28, label count = image count,
// labels in 0..9); IoError naming the file otherwise, or listing the missing files.
Mnist load_mnist(const std::string& dir);

}  // namespace kiln::data
