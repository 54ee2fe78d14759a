#!/usr/bin/env bash
# Fault tests of data-parallel jobs on a machine with 2 NVIDIA GPUs (not part of CI): a stopped
# rank, a killed rank, a killed launcher while a rank is stopped, ranks blocked in item(),
# synchronize() and an event wait behind a replayed CUDA graph, a restart that resumes from the
# last checkpoint, and two kiln-runs as two nodes. Each prints one line: exit code, seconds, and
# whether any process was left behind. Expects a build in ${KILN_BUILD_DIR:-build-gpu} with a warm
# kernel cache and MNIST in $KILN_MNIST_DIR; logs go to ${OUT:-gpu-faults-out}.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-faults-out}; mkdir -p "$out"
b=${KILN_BUILD_DIR:-build-gpu}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T=${FAULT_TIMEOUT_S:-10}
export KILN_DIST_TIMEOUT_S=$T
train="$PWD/$b/examples/mnist/mnist-train"; run="$PWD/$b/tools/kiln-run"; fault="$PWD/$b/tests/kiln_dist_fault"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -lt 2 ]; then echo "gpu_faults: needs 2 GPUs, found $gpus"; exit 77; fi
now() { date +%s%N; }
secs() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", (b - a) / 1e9 }'; }  # since a now()
# Processes whose command line starts with the program's path (not a shell that merely names it).
left() { pgrep -f "^$1" >/dev/null && echo "LEFT BEHIND: $(pgrep -af "^$1" | tr '\n' ';')" || echo "none left"; }
# The pid of the rank with RANK=$2 among the descendants of pid $1.
rank_pid() {
  for p in $(pgrep -f "^$3"); do
    tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "RANK=$2" && { echo "$p"; return; }
  done
}
wait_for() {  # file pattern seconds
  for _ in $(seq 1 $(($3 * 10))); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done; return 1
}

# Which cases run: FAULT_CASES (default all), e.g. "stop sync".
cases=${FAULT_CASES:-stop sync kill launcher resume nodes}
want() { case " $cases " in *" $1 "*) return 0 ;; esac; return 1; }

# 1. SIGSTOP of rank 1 during compiled training (the issue's reproducer).
stop_case() {  # name program-pattern launch...
  local name=$1 pattern=$2; shift 2
  "$@" >"$out/$name.log" 2>&1 &
  local launcher=$!
  wait_for "$out/$name.log" "${READY:-epoch 1}" 120 || echo "$name: never got going"
  sleep 2
  local victim; victim=$(rank_pid "$launcher" 1 "$pattern")
  local t0; t0=$(now)
  kill -STOP "$victim"
  wait "$launcher"; local code=$?
  local took; took=$(secs "$t0")
  sleep 0.5
  echo "$name: SIGSTOP of rank 1 (pid $victim): kiln-run exit $code after ${took} s (T = $T s); $(left "$pattern")"
  grep -m2 -E "kiln.dist: error|ending the process" "$out/$name.log" | sed 's/^/    /'
}
common=(--model cnn --epochs 100 --batch-size 64 --precision bf16)
want stop && stop_case train_stop "$train" "$run" -n 2 --grace 2 -- "$train" "${common[@]}"

# 2. The same with the host blocked in item(), synchronize() and an event wait after each replay.
want sync && for sync in item synchronize event; do
  READY="ready" stop_case "fault_$sync" "$fault" "$run" -n 2 --grace 2 -- "$fault" "$sync" 1000000
done

# 3. SIGKILL of rank 1 during compiled training.
if want kill; then
"$run" -n 2 --grace 2 -- "$train" "${common[@]}" >"$out/train_kill.log" 2>&1 &
launcher=$!
wait_for "$out/train_kill.log" "epoch 1" 120; sleep 2
victim=$(rank_pid "$launcher" 1 "$train"); t0=$(now); kill -KILL "$victim"; wait "$launcher"; code=$?
echo "train_kill: SIGKILL of rank 1: kiln-run exit $code after $(secs "$t0") s; $(sleep 0.5; left "$train")"

fi

# 4. SIGKILL of kiln-run while rank 1 is stopped (and rank 0 blocked behind it): no orphans.
if want launcher; then
"$run" -n 2 --grace 2 -- "$train" "${common[@]}" >"$out/launcher_kill.log" 2>&1 &
launcher=$!
wait_for "$out/launcher_kill.log" "epoch 1" 120; sleep 2
victim=$(rank_pid "$launcher" 1 "$train"); kill -STOP "$victim"; sleep 1
t0=$(now); kill -KILL "$launcher"
for _ in $(seq 1 50); do pgrep -f "^$train" >/dev/null || break; sleep 0.1; done
echo "launcher_kill: SIGKILL of kiln-run with rank 1 stopped: ranks gone after $(secs "$t0") s; $(left "$train")"
pkill -KILL -f "^$train" 2>/dev/null
fi

# 5. kill -9 of a rank under --max-restarts 1: resumes from the last checkpoint and ends with the
#    weights of an uninterrupted run.
if want resume; then
resume=(--model cnn --epochs 6 --batch-size 64 --seed 3)
"$run" -n 2 -- "$train" "${resume[@]}" --save "$out/straight.safetensors" --metrics "$out/straight.jsonl" \
  >"$out/straight.log" 2>&1; echo "resume: uninterrupted run exit $?"
rm -f "$out/ck.safetensors"
"$run" -n 2 --max-restarts 1 -- "$train" "${resume[@]}" --checkpoint "$out/ck.safetensors" --resume auto \
  --save "$out/resumed.safetensors" --metrics "$out/resumed.jsonl" >"$out/resumed.log" 2>&1 &
launcher=$!
for _ in $(seq 1 1200); do [ -e "$out/ck.safetensors" ] && break; sleep 0.1; done
victim=$(rank_pid "$launcher" 1 "$train"); kill -KILL "$victim"; wait "$launcher"; code=$?
echo "resume: kill -9 of rank 1 after the first checkpoint, --max-restarts 1: exit $code;" \
  "$(grep -c 'restarting' "$out/resumed.log") restart(s); final weights" \
  "$(cmp -s "$out/straight.safetensors" "$out/resumed.safetensors" && echo IDENTICAL || echo DIFFERENT)"

fi

# 6. Two kiln-runs as two nodes of one GPU each, master on 127.0.0.2, beside one node of 2 GPUs.
want nodes || exit 0
two=(--model cnn --epochs 2 --batch-size 256 --seed 5)
"$run" -n 2 -- "$train" "${two[@]}" --metrics "$out/one_node.jsonl" >"$out/one_node.log" 2>&1
echo "nodes: one node of 2 GPUs exit $?"
port=$((29000 + RANDOM % 1000))
CUDA_VISIBLE_DEVICES=1 "$run" --nnodes 2 --node-rank 1 --master-addr 127.0.0.2 --master-port $port -n 1 -- \
  "$train" "${two[@]}" >"$out/node1.log" 2>&1 &
n1=$!
CUDA_VISIBLE_DEVICES=0 "$run" --nnodes 2 --node-rank 0 --master-addr 127.0.0.2 --master-port $port -n 1 -- \
  "$train" "${two[@]}" --metrics "$out/two_nodes.jsonl" >"$out/node0.log" 2>&1
c0=$?; wait $n1; c1=$?
echo "nodes: two nodes of 1 GPU exit $c0 / $c1"
python3 - "$out" <<'PY'
import json, sys
d = sys.argv[1]
rows = lambda f: [json.loads(l) for l in open(f"{d}/{f}.jsonl") if l.strip()]
try:
    a, b = rows("one_node"), rows("two_nodes")
except OSError as e:
    sys.exit(f"nodes: {e}")
for x, y in zip(a, b):
    print(f"nodes: epoch {x['epoch']}: train loss {x['train_loss']:.6f} / {y['train_loss']:.6f}, "
          f"test accuracy {100 * x['test_accuracy']:.2f}% / {100 * y['test_accuracy']:.2f}%")
same = len(a) == len(b) and all(x[k] == y[k] for x, y in zip(a, b) for k in ("train_loss", "test_loss", "test_accuracy"))
print("nodes: loss curves", "IDENTICAL" if same else "DIFFERENT")
PY
