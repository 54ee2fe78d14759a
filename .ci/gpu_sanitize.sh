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

run() {  # tool name command...
  local tool=$1 name=$2; shift 2
  local log="$out/sanitize_${tool}_${name}.log" start=$SECONDS extra=()
  # racecheck follows shared memory only, and cuBLAS's kernels would take it hours: kiln's own.
  [ "$tool" = racecheck ] && extra=(--kernel-name kns=kiln_)
  compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 99 --print-limit 20 "$@" >"$log" 2>&1
  local rc=$?
  echo "compute-sanitizer $tool $name: exit $rc, $(grep -m1 -E '(ERROR|RACECHECK) SUMMARY' "$log" || echo 'no summary'), $((SECONDS - start)) s"
  [ $rc -eq 0 ] || grep -m10 -E '=========  (Invalid|Uninitialized|Race|Error|Program hit)' "$log"
  return $rc
}

# The tools run side by side (each over the suite, then the two trainer runs); the GPU has room.
pids=()
for tool in ${GPU_SANITIZE_TOOLS:-memcheck racecheck initcheck}; do
  (
    rc=0
    run "$tool" gpu_tests "$b/tests/gpu_tests" ${GPU_SANITIZE_TESTS:-} || rc=1
    for model in mlp cnn; do
      run "$tool" "mnist_$model" "$b/examples/mnist/mnist-train" --model "$model" --epochs 1 --seed 1 || rc=1
    done
    exit $rc
  ) >"$out/sanitize_$tool.summary" &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
cat "$out"/sanitize_*.summary
exit $status
