#!/usr/bin/env bash
# CI's sanitizer job: one clang build with ASan and UBSan (any report fails the run) of the
# CPU suites and the fuzz targets. Runs the suites, then each fuzz target for
# ${KILN_FUZZ_SECONDS:-60} s from its seed corpus (tests/fuzz/run_fuzz.sh). KILN_CMAKE_ARGS: extra
# configure flags (.ci/run passes -DKILN_WERROR=ON).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KILN_SANITIZE_BUILD:-build-san}

# clang and its libFuzzer runtime (Debian ships the runtime apart from the compiler).
fuzzer_lib() { ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; }
if ! command -v clang++ >/dev/null || ! fuzzer_lib; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends clang >/dev/null
  major=$(clang++ --version | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -1)
  fuzzer_lib || DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "libclang-rt-$major-dev" >/dev/null
fi

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# The main build's kernel cache, when it has one: every kernel its tests compiled is read back
# here (same sources, options and NVRTC), so this job compiles only what they did not.
shared_cache=()
main_cache=$PWD/${KILN_BUILD_DIR:-build}/test-kernel-cache
[ -d "$main_cache" ] && shared_cache=(-DKILN_TEST_CACHE_DIR="$main_cache")
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O1 -g1" \
  -DKILN_SANITIZE=address,undefined -DKILN_FUZZ=ON -DKILN_BUILD_GPU_TESTS=OFF -DKILN_BUILD_BENCHMARKS=OFF "${launcher[@]}" "${shared_cache[@]}" \
  ${KILN_CMAKE_ARGS:-} >/dev/null
cmake --build "$build"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:suppressions=$PWD/.ci/lsan.supp
export LSAN_OPTIONS=suppressions=$PWD/.ci/lsan.supp
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The GPU suite, with nothing to run without a GPU, is not built; the embedding example builds
# an install.
jobs=$(nproc 2>/dev/null || echo 2)
ctest --test-dir "$build" --output-on-failure -j "$((jobs < 4 ? 4 : jobs))" -E '^embed_example$'
KILN_FUZZ_BUILD=$PWD/$build bash tests/fuzz/run_fuzz.sh "${KILN_FUZZ_SECONDS:-60}"
