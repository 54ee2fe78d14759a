#pragma once
// Where the MNIST files are: --data, else $KILN_MNIST_DIR, else ./data/mnist. When that lacks
// them, they are fetched from public mirrors (curl or wget) and checked against their MD5 sums,
// unless KILN_MNIST_NO_DOWNLOAD is set.
#include <stdexcept>
#include <string>

namespace mnist {

struct MissingDataset : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The directory holding the four files. MissingDataset, saying which files to put where, when
// they are neither there nor downloadable.
std::string locate_dataset(const std::string& data_flag);

}  // namespace mnist
