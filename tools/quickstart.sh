#!/usr/bin/env bash
# The README's quick start: installs what is missing (Debian/Ubuntu), builds, then
#   tools/quickstart.sh test          builds and runs the test suite (ctest)
#   tools/quickstart.sh mnist [ARGS]  trains MNIST (GPU when present, else CPU)
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-}
[ $# -gt 0 ] && shift
case "$what" in
  test | mnist) ;;
  *) echo "usage: tools/quickstart.sh test|mnist [trainer flags]" >&2; exit 2 ;;
esac

[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
if ! command -v nvcc >/dev/null && [ ! -e /usr/local/cuda/include/nvrtc.h ]; then
  echo "kiln needs the CUDA toolkit (NVRTC, cuBLAS headers and libraries), e.g. in /usr/local/cuda" >&2
  exit 1
fi

# A package is needed only when what it provides is absent (tools may come from elsewhere).
has() {
  case "$1" in
    cmake) command -v cmake >/dev/null ;;
    ninja-build) command -v ninja >/dev/null ;;
    g++) command -v g++ >/dev/null ;;
    pkg-config) command -v pkg-config >/dev/null ;;
    libspdlog-dev) [ -e /usr/include/spdlog/spdlog.h ] ;;
    doctest-dev) [ -e /usr/include/doctest/doctest.h ] ;;
    libcli11-dev) [ -e /usr/include/CLI/CLI.hpp ] ;;
    nlohmann-json3-dev) [ -e /usr/include/nlohmann/json.hpp ] ;;
    zlib1g-dev) [ -e /usr/include/zlib.h ] ;;
    libopenblas-dev) ldconfig -p 2>/dev/null | grep -q libopenblas ;;
    *) dpkg -s "$1" >/dev/null 2>&1 ;;
  esac
}
packages="cmake ninja-build g++ libspdlog-dev doctest-dev libcli11-dev nlohmann-json3-dev zlib1g-dev libopenblas-dev pkg-config"
missing=""
for p in $packages; do has "$p" || missing="$missing $p"; done
sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
if [ -n "$missing" ]; then
  echo "installing:$missing"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing
fi
# oneDNN runs the CPU convolutions where a release packages it; without it they take im2col + GEMM.
if [ ! -e /usr/include/oneapi/dnnl/dnnl.hpp ] && command -v apt-get >/dev/null; then
  [ -n "$missing" ] || $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends libdnnl-dev >/dev/null ||
    echo "libdnnl-dev is not available here: CPU convolutions use im2col + OpenBLAS" >&2
fi

build=${KILN_BUILD_DIR:-build}
# KILN_CMAKE_ARGS: extra configure flags (CI passes -DKILN_WERROR=ON).
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${KILN_CMAKE_ARGS:-} >/dev/null

case "$what" in
  test)
    cmake --build "$build" --target kiln_tests
    # Suites run a ctest test per source file; these overlap CPU work with tests that wait on
    # child processes. Kernels compiled once stay in the build's test cache for the next run.
    jobs=$(nproc 2>/dev/null || echo 2)
    ctest --test-dir "$build" --output-on-failure -j "$((jobs < 4 ? 4 : jobs))" ;;
  mnist)
    cmake --build "$build" --target mnist-train
    "$build/examples/mnist/mnist-train" "$@" ;;
esac
