// cuBLAS and cuBLASLt load on first use, not with libkiln: CPU work maps none of their 500+ MB
// (which cost every process about 0.1 s at start), and the first call loads both.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "cublas_loader.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

std::string mapped_files() {
  std::ifstream in("/proc/self/maps");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("cuBLAS is loaded by its first call, not by CPU work") {
  // A CPU matmul, linear layer and conv: OpenBLAS and kiln's loops, no cuBLAS.
  Generator gen(3);
  const Tensor a = randn({64, 48}, {}, &gen), b = randn({48, 32}, {}, &gen);
  CHECK(matmul(a, b).shape() == Shape{64, 32});
  const Tensor x = randn({2, 3, 9, 9}, {}, &gen), w = randn({4, 3, 3, 3}, {}, &gen);
  CHECK(conv2d(x, w).shape() == Shape{2, 4, 7, 7});
  CHECK_FALSE(rt::cublas_loaded());
  CHECK(mapped_files().find("libcublas") == std::string::npos);

  // Loading needs no GPU: the version is a plain library call.
  CHECK(rt::cublas().cublasLtGetVersion() >= 130000);
  CHECK(rt::cublas_loaded());
  const std::string maps = mapped_files();
  CHECK(maps.find("libcublasLt.so") != std::string::npos);
  CHECK(maps.find("libcublas.so") != std::string::npos);
}
