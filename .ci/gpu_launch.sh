#!/usr/bin/env bash
# kiln-run on a machine with 2 NVIDIA GPUs (not part of CI), for issue 23:
#  1. two nodes on one machine (a kiln-run per GPU, master 127.0.0.2): the cnn's loss curve beside
#     the one-node `kiln-run -n 2` run with the same seed and batch;
#  2. SIGKILL of kiln-run while the ranks train, with rank 1 SIGSTOPped: the exit code and whether
#     every rank is gone within 2 s (the reaper's promise).
# Expects a build in ${KILN_BUILD_DIR:-build-gpu} and the MNIST files in $KILN_MNIST_DIR; logs go
# to ${OUT:-gpu-launch-out}.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-launch-out}; mkdir -p "$out"
b=${KILN_BUILD_DIR:-build-gpu}
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -lt 2 ]; then echo "gpu_launch: needs 2 GPUs, found $gpus"; exit 77; fi
ninja -C "$b" mnist-train kiln-run >"$out/build.log" 2>&1 || { grep -B2 -A12 -m3 'error' "$out/build.log"; exit 1; }
train="$b/examples/mnist/mnist-train"; run="$b/tools/kiln-run"
common=(--model cnn --epochs ${LAUNCH_EPOCHS:-3} --seed 1 --batch-size 1024)
export KILN_DIST_TIMEOUT_S=${KILN_DIST_TIMEOUT_S:-60}

# 1. One node with 2 ranks, then two nodes with one rank each (each node sees its own GPU as cuda:0).
"$run" -n 2 -- "$train" "${common[@]}" --metrics "$out/one_node.jsonl" >"$out/one_node.log" 2>&1
echo "one node, 2 GPUs: exit $?"
port=29531
nodes=(--nnodes 2 -n 1 --master-addr 127.0.0.2 --master-port $port)
CUDA_VISIBLE_DEVICES=0 "$run" "${nodes[@]}" --node-rank 0 -- "$train" "${common[@]}" --metrics "$out/two_nodes.jsonl" \
  >"$out/node0.log" 2>&1 &
n0=$!
CUDA_VISIBLE_DEVICES=1 "$run" "${nodes[@]}" --node-rank 1 -- "$train" "${common[@]}" >"$out/node1.log" 2>&1
c1=$?; wait $n0; c0=$?
echo "two nodes of 1 GPU: node 0 exit $c0, node 1 exit $c1"
python3 - "$out" <<'PY'
import json, sys
d = sys.argv[1]
rows = lambda f: [json.loads(l) for l in open(f"{d}/{f}.jsonl") if l.strip()]
for a, b in zip(rows("one_node"), rows("two_nodes")):
    print(f"epoch {a['epoch']}: train loss one node {a['train_loss']:.6f}, two nodes {b['train_loss']:.6f}; "
          f"test accuracy {100 * a['test_accuracy']:.2f}% / {100 * b['test_accuracy']:.2f}%")
PY

# 2. SIGKILL of kiln-run 8 s into training, rank 1 stopped 2 s before.
"$run" -n 2 -- "$train" --model cnn --epochs 100 --batch-size 64 --precision bf16 >"$out/killed.log" 2>&1 &
k=$!
sleep 6
ranks=$(pgrep -P $k -x mnist-train | tr '\n' ' ')
rank1=$(for p in $ranks; do tr '\0' '\n' </proc/$p/environ | grep -qx RANK=1 && echo $p; done)
kill -STOP $rank1; sleep 2
t0=$(date +%s.%N); kill -9 $k; wait $k; code=$?
left=$ranks
while [ -n "$left" ] && [ "$(awk "BEGIN{print ($(date +%s.%N) - $t0 < 10)}")" = 1 ]; do
  left=$(for p in $ranks; do [ -e /proc/$p ] && [ "$(cut -d' ' -f3 /proc/$p/stat)" != Z ] && echo $p; done | tr '\n' ' ')
  sleep 0.05
done
echo "kill -9 of kiln-run (ranks $ranks; rank 1 = $rank1 stopped): exit $code; ranks gone after" \
  "$(awk "BEGIN{print $(date +%s.%N) - $t0}") s; left: ${left:-none}"
grep "reaper" "$out/killed.log"
for p in $left; do kill -9 $p; done
