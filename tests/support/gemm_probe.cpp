// kiln_gemm_probe DTYPE: one cuBLAS product into a fresh output, read back by a kiln kernel
// (a cast) and compared with the CPU. Run under `compute-sanitizer --tool initcheck`, it shows
// that initcheck reports reads of cuBLAS's output on sm_90 that the correct values prove were
// written (.ci/gpu_sanitize.sh records the count). Exit 0 when the values match.
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>

#include "kiln/kiln.h"

int main(int argc, char** argv) {
  using namespace kiln;
  if (argc != 2) {
    std::fprintf(stderr, "usage: kiln_gemm_probe f16|bf16|f32\n");
    return 2;
  }
  try {
    const DType dt = DTypes::parse(argv[1])[0];
    Generator g(1);
    const Tensor a = randn({64, 48}, {}, &g).to(dt), b = randn({48, 32}, {}, &g).to(dt);
    const Tensor gpu = matmul(a.to(Device::cuda(0)), b.to(Device::cuda(0))).to(DType::f64).to(Device::cpu());
    const std::vector<double> got = gpu.to_vector<double>(), want = matmul(a, b).to(DType::f64).to_vector<double>();
    const double tol = dt == DType::bf16 ? 1e-2 : dt == DType::f16 ? 2e-3 : 1e-5;
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i) worst = std::fmax(worst, std::fabs(got[i] - want[i]) / (1 + std::fabs(want[i])));
    std::printf("kiln_gemm_probe %s: %zu elements, worst relative difference %.3g (tolerance %.0e)\n", argv[1],
                got.size(), worst, tol);
    return worst <= tol ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln_gemm_probe: %s\n", e.what());
    return 1;
  }
}
