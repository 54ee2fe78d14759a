#!/usr/bin/env bash
# compute-sanitizer's memcheck, racecheck and initcheck over the GPU suite and one epoch of
# each trainer model, on a machine with an NVIDIA GPU (not part of CI). Expects a build in
# ${KILN_BUILD_DIR:-build-gpu} with a warm kernel cache and MNIST in $KILN_MNIST_DIR.
# GPU_SANITIZE_TESTS narrows the suite (doctest -tc filters); logs go to ${OUT:-gpu-sanitize-out}.
# Prints one line per run: tool, target, exit code, the sanitizer's error summary, seconds.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-sanitize-out}; mkdir -p "$out"
b=${KILN_BUILD_DIR:-build-gpu}
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$PWD/$b/test-kernel-cache}
command -v compute-sanitizer >/dev/null || { echo "compute-sanitizer not found"; exit 1; }
status=0

run() {  # tool name command...
  local tool=$1 name=$2; shift 2
  local log="$out/sanitize_${tool}_${name}.log" start=$SECONDS
  compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 --target-processes all "$@" >"$log" 2>&1
  local rc=$?
  echo "compute-sanitizer $tool $name: exit $rc, $(grep -m1 'ERROR SUMMARY' "$log" || echo 'no summary'), $((SECONDS - start)) s"
  [ $rc -eq 0 ] || { status=1; grep -m10 -E '=========  (Invalid|Uninitialized|Race|Error|Program hit)' "$log"; }
}

for tool in ${GPU_SANITIZE_TOOLS:-memcheck racecheck initcheck}; do
  run "$tool" gpu_tests "$b/tests/gpu_tests" ${GPU_SANITIZE_TESTS:-}
  for model in mlp cnn; do
    run "$tool" "mnist_$model" "$b/examples/mnist/mnist-train" --model "$model" --epochs 1 --seed 1
  done
done
exit $status
