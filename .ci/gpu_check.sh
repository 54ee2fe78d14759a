#!/usr/bin/env bash
# GPU verification on a machine with an NVIDIA GPU (not part of CI, which has none):
# builds, proves a warmed cache compiles nothing, runs every suite, and records the
# runtime figures. Logs go to ${OUT:-gpu-check-out}.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-check-out}; mkdir -p "$out"
b=${KILN_BUILD_DIR:-build-gpu}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/env.txt"
cmake -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
ninja -C "$b" >"$out/build.log" 2>&1 || { grep -B2 -A12 -m3 'error' "$out/build.log"; exit 1; }

# A cold `jitcc warm --arch auto`, then processes that load / launch every kernel with compiling forbidden.
export KILN_CACHE_DIR=$PWD/$b/test-kernel-cache
rm -rf "$KILN_CACHE_DIR"
"$b/tools/jitcc" warm --arch auto --json | tee "$out/warm.json"
"$b/tests/kiln_test_helper" nvrtc-median 90 | tee "$out/nvrtc.json"
KILN_NO_COMPILE=1 "$b/tests/kiln_test_helper" load-all | tee "$out/load_all.json"

# Benchmarks: kiln and PyTorch on the same GPU, one after the other (GPU_CHECK_BENCH=0 skips).
if [ "${GPU_CHECK_BENCH:-1}" = 1 ]; then
  "$b/tools/bench_ops" >"$out/bench_kiln.txt" 2>&1; tail -40 "$out/bench_kiln.txt"
  python3 tools/bench/bench_ops_torch.py >"$out/bench_torch.txt" 2>&1; tail -40 "$out/bench_torch.txt"
fi

KILN_NO_COMPILE=1 timeout ${GPU_TEST_TIMEOUT:-300} "$b/tests/gpu_tests" ${GPU_TEST_ARGS:-} >"$out/gpu_tests_no_compile.log" 2>&1
echo "gpu_tests with KILN_NO_COMPILE=1: exit $?"
grep -E "^consistency:|^gradcheck_gpu:|^backward_gpu_vs_cpu:|test cases:|assertions:" "$out/gpu_tests_no_compile.log"
grep -E "ERROR|FAILED|SIGSEGV|mismatch" "$out/gpu_tests_no_compile.log" | head -40
# gpu_tests already ran above, from the warmed cache with compiling forbidden.
ctest --test-dir "$b" --output-on-failure -j4 -E gpu_tests >"$out/ctest.log" 2>&1
echo "ctest: exit $?"; grep -E 'tests passed|Failed|Passed|Skipped' "$out/ctest.log"

# Every registry op against PyTorch on this GPU: values, gradients, edge values (tools/difftest).
KILN_BUILD_DIR=$b tools/difftest/run.sh cuda "$out/difftest" >"$out/difftest.log" 2>&1
echo "difftest: exit $?"; grep -E "^difftest:|^FAIL|^  FAIL|^known difference" "$out/difftest.log" | head -60

# compute-sanitizer over the GPU suite and the trainer (GPU_CHECK_SANITIZE=0 skips; slow).
if [ "${GPU_CHECK_SANITIZE:-1}" = 1 ]; then
  KILN_BUILD_DIR=$b OUT=$out bash .ci/gpu_sanitize.sh
  echo "gpu_sanitize: exit $?"
fi
