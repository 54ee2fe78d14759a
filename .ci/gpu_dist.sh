#!/usr/bin/env bash
# Data-parallel checks on a machine with 2 or more NVIDIA GPUs (not part of CI): the dist GPU
# tests, then the cnn at batch 1024 per GPU on 1 and $DIST_NPROC (2) GPUs (samples/s, their
# ratio) and that run's loss curve beside one GPU with the same global batch. Expects a build in
# ${KILN_BUILD_DIR:-build-gpu} and the MNIST files in $KILN_MNIST_DIR; logs go to ${OUT:-gpu-dist-out}.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-dist-out}; mkdir -p "$out"
b=${KILN_BUILD_DIR:-build-gpu}
n=${DIST_NPROC:-2}  # ranks; DIST_NPROC=1 runs the same path through NCCL on one GPU
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -lt "$n" ]; then echo "gpu_dist: needs $n GPUs, found $gpus"; exit 77; fi
ninja -C "$b" mnist-train kiln-run kiln_test_helper gpu_tests tools_tests >"$out/build.log" 2>&1 || { grep -B2 -A12 -m3 'error' "$out/build.log"; exit 1; }
"$b/tests/gpu_tests" -tc="*dist*,*GradReducer*,*SyncBatchNorm*,*sync_batch_norm*" >"$out/gpu_tests.log" 2>&1; echo "dist GPU tests: exit $? $(grep -E '^\[doctest\] test cases' "$out/gpu_tests.log")"
"$b/tests/tools_tests" -tc="*launcher*,*kiln-run*,*two GPUs*" >"$out/tools_tests.log" 2>&1; echo "mnist-train data-parallel tests: exit $? $(grep -E '^\[doctest\] test cases' "$out/tools_tests.log")"

train="$b/examples/mnist/mnist-train"; run="$b/tools/kiln-run"
common=(--model cnn --epochs ${DIST_EPOCHS:-3} --seed 1)
"$train" "${common[@]}" --batch-size 1024 --metrics "$out/one_b1024.jsonl" >"$out/one_b1024.log" 2>&1; echo "1 GPU, batch 1024: exit $?"
"$train" "${common[@]}" --batch-size $((1024 * n)) --metrics "$out/one_global.jsonl" >"$out/one_global.log" 2>&1; echo "1 GPU, batch $((1024 * n)): exit $?"
"$run" -n "$n" -- "$train" "${common[@]}" --batch-size 1024 --metrics "$out/many.jsonl" >"$out/many.log" 2>&1; echo "$n GPUs, batch 1024 each: exit $?"
python3 - "$out" "$n" <<'PY'
import json, sys
d, n = sys.argv[1], sys.argv[2]
rows = lambda f: [json.loads(l) for l in open(f"{d}/{f}.jsonl") if l.strip()]
one, one_global, two = rows("one_b1024"), rows("one_global"), rows("many")
# The first epoch holds the warm-up and capture: samples/s over the later ones.
rate = lambda r: sum(x["samples_per_s"] for x in r[1:]) / max(1, len(r) - 1)
print(f"samples/s: 1 GPU {rate(one):.0f}, {n} GPUs {rate(two):.0f}: {rate(two) / rate(one):.2f}x")
for a, b in zip(one_global, two):
    print(f"epoch {a['epoch']}: train loss 1 GPU (same global batch) {a['train_loss']:.5f}, {n} GPUs {b['train_loss']:.5f}; "
          f"test accuracy {100 * a['test_accuracy']:.2f}% / {100 * b['test_accuracy']:.2f}%")
PY
