#!/usr/bin/env bash
# MNIST on a machine with an NVIDIA GPU (not part of CI): the trainer's defaults over 5
# seeds per model, determinism of one seed, the CPU mlp epoch, and bench_mnist next to
# PyTorch. Expects a build in ${KILN_BUILD_DIR:-build-gpu} (.ci/gpu_check.sh makes one) and
# the MNIST files in $KILN_MNIST_DIR. Logs go to ${OUT:-gpu-mnist-out}.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-mnist-out}; mkdir -p "$out"
b=${KILN_BUILD_DIR:-build-gpu}
ninja -C "$b" mnist-train bench_mnist >"$out/build_mnist.log" 2>&1 || { grep -B2 -A12 -m3 'error' "$out/build_mnist.log"; exit 1; }
train="$b/examples/mnist/mnist-train"

for model in ${MNIST_MODELS:-mlp cnn}; do
  for seed in ${MNIST_SEEDS:-1 2 3 4 5}; do
    "$train" --model "$model" --seed "$seed" --metrics "$out/${model}_seed$seed.jsonl" >"$out/${model}_seed$seed.log" 2>&1
    echo "$model seed $seed: exit $? $(grep -E 'best test accuracy' "$out/${model}_seed$seed.log") $(grep -E '^time to' "$out/${model}_seed$seed.log")"
  done
done
python3 - "$out" <<'PY'
import glob, json, sys
for model in ("mlp", "cnn"):
    best = []
    for f in sorted(glob.glob(f"{sys.argv[1]}/{model}_seed*.jsonl")):
        rows = [json.loads(l) for l in open(f) if l.strip()]
        if rows:
            best.append(rows[-1]["test_accuracy"])
    if best:
        print(f"{model}: final test accuracy over {len(best)} seeds: min {100*min(best):.2f}% mean {100*sum(best)/len(best):.2f}%")
PY
# Same seed, same device: the same numbers.
"$train" --model mlp --seed 1 --epochs 2 --metrics "$out/det_a.jsonl" >/dev/null 2>&1
"$train" --model mlp --seed 1 --epochs 2 --metrics "$out/det_b.jsonl" >/dev/null 2>&1
python3 -c "import json,sys; a=[json.loads(l) for l in open(sys.argv[1])]; b=[json.loads(l) for l in open(sys.argv[2])]; k=('train_loss','test_loss','test_accuracy'); print('determinism (mlp seed 1, 2 epochs, losses and accuracy):', 'same' if all(x[i]==y[i] for x,y in zip(a,b) for i in k) else 'DIFFERENT')" "$out/det_a.jsonl" "$out/det_b.jsonl"
# The CPU run of the mlp, one epoch.
"$train" --model mlp --device cpu --epochs 1 --metrics "$out/mlp_cpu.jsonl" >"$out/mlp_cpu.log" 2>&1
echo "mlp cpu 1 epoch: exit $? $(tail -4 "$out/mlp_cpu.log" | head -1)"; grep -E '^epoch' "$out/mlp_cpu.log"

"$b/tools/bench_mnist" >"$out/bench_mnist_kiln.txt" 2>&1; cat "$out/bench_mnist_kiln.txt"
python3 tools/bench/bench_mnist_torch.py --kiln "$out/bench_mnist_kiln.txt" >"$out/bench_mnist_torch.txt" 2>&1
cat "$out/bench_mnist_torch.txt"
