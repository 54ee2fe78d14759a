#!/usr/bin/env bash
# compute-sanitizer on a machine with an NVIDIA GPU (not part of CI): memcheck and initcheck
# over the GPU suite and one epoch of each trainer model, racecheck over the suite's files
# whose kernels are all kiln's. Expects a build in
# ${KILN_BUILD_DIR:-build-gpu} with a warm kernel cache and MNIST in $KILN_MNIST_DIR.
# GPU_SANITIZE_TESTS narrows the suite (doctest -tc filters); logs go to ${OUT:-gpu-sanitize-out}.
# Prints one line per run: tool, target, exit code, the sanitizer's error summary, seconds.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-sanitize-out}; mkdir -p "$out"
b=${KILN_BUILD_DIR:-build-gpu}
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$PWD/$b/test-kernel-cache}
command -v compute-sanitizer >/dev/null || { echo "compute-sanitizer not found"; exit 1; }

run() {  # tool name [sanitizer options] -- command...
  local tool=$1 name=$2; shift 2
  local opts=()
  while [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  local log="$out/sanitize_${tool}_${name}.log" start=$SECONDS
  compute-sanitizer --tool "$tool" "${opts[@]}" --error-exitcode 99 --print-limit 20 "$@" >"$log" 2>&1
  local rc=$?
  echo "compute-sanitizer $tool $name: exit $rc, $(grep -m1 -E '(ERROR|RACECHECK) SUMMARY' "$log" || echo 'no summary'), $((SECONDS - start)) s"
  [ $rc -eq 0 ] || grep -m10 -E '=========  ?(Invalid|Uninitialized|Race|Error|Program hit|Internal)' "$log"
  return $rc
}

suite="$b/tests/gpu_tests"
train="$b/examples/mnist/mnist-train"
# The suite provokes CUDA API errors on purpose (an impossible allocation, a corrupted cache
# entry, the elapsed time of an event made without timing) and checks them itself.
quiet_api=(--report-api-errors no)
# racecheck stops with an internal error inside cuBLAS's Hopper kernels, so it covers the
# test files whose kernels are all kiln's (reductions, softmax, norms, index, random, optim).
no_cublas=(-sfe='*conv_pool*,*gemm*,*training*,*nn_modules*,*consistency*,*gradcheck_gpu*')

# memcheck and initcheck: the whole suite, then one epoch of each trainer model.
suite_and_trainer() {
  local tool=$1 rc=0
  run "$tool" gpu_tests "${quiet_api[@]}" -- "$suite" ${GPU_SANITIZE_TESTS:-} || rc=1
  for model in mlp cnn; do run "$tool" "mnist_$model" -- "$train" --model "$model" --epochs 1 --seed 1 || rc=1; done
  return $rc
}
memcheck() { suite_and_trainer memcheck; }
# initcheck does not see cuBLAS's stores on sm_90: the probe's reads of a verified-correct
# product are reported. Recorded, then the suite runs with GEMM outputs zeroed beforehand.
initcheck() {
  local rc=0
  for dt in f16 bf16 f32; do
    run initcheck "gemm_probe_$dt" -- "$b/tests/kiln_gemm_probe" "$dt" | head -1
    grep -h '^kiln_gemm_probe' "$out/sanitize_initcheck_gemm_probe_$dt.log"
  done
  KILN_INITCHECK_GEMM=1 suite_and_trainer initcheck || rc=1
  return $rc
}
racecheck() { run racecheck gpu_tests_kiln_kernels "${quiet_api[@]}" -- "$suite" "${no_cublas[@]}" ${GPU_SANITIZE_TESTS:-}; }

# The tools run side by side; the GPU has room for all three.
pids=()
for tool in ${GPU_SANITIZE_TOOLS:-memcheck racecheck initcheck}; do
  "$tool" >"$out/sanitize_$tool.summary" &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
cat "$out"/sanitize_*.summary
exit $status
