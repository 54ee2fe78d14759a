#!/usr/bin/env bash
# The data-parallel table on a machine with 2 or more GPUs, kiln beside PyTorch DDP in one go
# (about 3 minutes for 1 and 2 GPUs with a warm kernel cache): bench_dist alone (1 GPU, no DDP; it
# also warms the kernel cache), under kiln-run -n W for each world size W, then bench_dist_torch.py
# under torchrun with W processes. The worlds are BENCH_DIST_WORLDS, by default "1 2", and "1 2 4"
# on a machine with 4 GPUs or more. The launched runs add each bf16 row with gradients all-reduced in bf16 on both sides
# (BENCH_DIST_COMPRESS=0 leaves them out); BENCH_DIST_TORCH_SINGLE=1 adds PyTorch without DDP, and
# BENCH_DIST_DIAG=1 kiln on 2 GPUs without the all-reduce (the compute-only bound of the scaling).
# Prints a markdown table; the 1-GPU columns (the scaling's denominator) are the runs through the
# launchers in a world of 1: the same code path as 2 GPUs.
# Expects a build in ${KILN_BUILD_DIR:-build-gpu}; logs and JSON lines go to ${OUT:-bench-dist-out}.
# BENCH_DIST_STEPS (100) steps per timed window, 3 windows per row.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export KILN_DIST_TIMEOUT_S=${KILN_DIST_TIMEOUT_S:-60}
out=${OUT:-bench-dist-out}
mkdir -p "$out"
rm -f "$out"/kiln.jsonl "$out"/torch.jsonl
b=${KILN_BUILD_DIR:-build-gpu}
steps=${BENCH_DIST_STEPS:-100}
limit=${BENCH_DIST_TIMEOUT:-150}  # seconds per run: a hang must not eat the GPU session
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -lt 2 ]; then echo "bench_dist: needs 2 GPUs, found $gpus"; exit 77; fi
ninja -C "$b" bench_dist kiln-run >"$out/build.log" 2>&1 || { grep -B2 -A12 -m3 'error' "$out/build.log"; exit 1; }
bench="$b/tools/bench_dist"
launch="$b/tools/kiln-run"
torch_ok=1
python3 -c "import torch" 2>/dev/null || { torch_ok=0; echo "PyTorch not installed: the DDP columns stay empty"; }

# run NAME CMD...: the command under a time limit, its output in $out/NAME.log, one status line.
run() {
  local name=$1
  shift
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || tail -5 "$out/$name.log"
}
common=(--steps "$steps" --json "$out/kiln.jsonl")
extra=()
[ "${BENCH_DIST_COMPRESS:-1}" = 1 ] && extra=(--bf16-grads-row)
run kiln_alone "$bench" "${common[@]}"
default_worlds="1 2"
[ "$gpus" -ge 4 ] && default_worlds="1 2 4"
read -r -a worlds <<<"${BENCH_DIST_WORLDS:-$default_worlds}"
for w in "${worlds[@]}"; do
  if [ "$w" -gt "$gpus" ]; then echo "bench_dist: a world of $w needs $w GPUs, found $gpus"; exit 1; fi
done
for w in "${worlds[@]}"; do run "kiln_n$w" "$launch" -n "$w" -- "$bench" "${common[@]}" "${extra[@]}"; done
torchrun=(python3 -m torch.distributed.run --standalone)
tcommon=(tools/bench/bench_dist_torch.py --steps "$steps" --json "$out/torch.jsonl")
if [ $torch_ok = 1 ]; then
  for w in "${worlds[@]}"; do run "torch_n$w" "${torchrun[@]}" --nproc-per-node "$w" "${tcommon[@]}" "${extra[@]}"; done
  [ "${BENCH_DIST_TORCH_SINGLE:-0}" = 1 ] && run torch_alone python3 "${tcommon[@]}"
fi
if [ "${BENCH_DIST_DIAG:-0}" = 1 ]; then
  run kiln_n2_no_reducer "$launch" -n 2 -- "$bench" "${common[@]}" --no-reducer
fi

python3 - "$out" "${worlds[@]}" <<'PY'
import json, os, sys
d = sys.argv[1]
rows = []
for name in ("kiln.jsonl", "torch.jsonl"):
    path = os.path.join(d, name)
    if os.path.exists(path):
        rows += [json.loads(l) for l in open(path) if l.strip()]
def get(bench, model, prec, wire, world, ddp=True):
    for r in rows:
        key = (r["bench"], r["model"], r["precision"], r["grad_wire"], r["world"], r["ddp"], r.get("reducer", True))
        if key == (bench, model, prec, wire, world, ddp, ddp):
            return r
    return None
def rate(r):
    if r is None:
        return "—"
    text = f"{r['samples_per_s']:,.0f}/s"
    if r["bench"] == "torch" and r["mode"] != "graph":
        text += f" ({r['mode']})"
    if not r["weights_agree"]:
        text += " (weights differ)"
    return text
def ratio(a, b):
    return f"{a['samples_per_s'] / b['samples_per_s']:.2f}x" if a and b else "—"
keys = []
for r in rows:
    if not r["ddp"] or not r.get("reducer", True):
        continue
    k = (r["model"], r["precision"], r["grad_wire"])
    if k not in keys:
        keys.append(k)
worlds = [int(w) for w in sys.argv[2:]]
multi = [w for w in worlds if w > 1]
head = ["model", "precision"] + [f"kiln {w} GPU{'s' if w > 1 else ''}" for w in worlds]
head += [f"scaling {w}" for w in multi] + [f"DDP {w} GPU{'s' if w > 1 else ''}" for w in worlds]
head += [f"DDP scaling {w}" for w in multi] + [f"kiln/DDP at {w} GPUs" for w in multi]
print("\n| " + " | ".join(head) + " |")
print("|" + " --- |" * len(head))
met = total = 0
for model, prec, wire in keys:
    k = {w: get("kiln", model, prec, wire, w) for w in worlds}
    t = {w: get("torch", model, prec, wire, w) for w in worlds}
    label = prec + (", bf16 gradients" if wire == "bf16" else "")
    cells = [model, label] + [rate(k[w]) for w in worlds] + [ratio(k[w], k.get(1)) for w in multi]
    cells += [rate(t[w]) for w in worlds] + [ratio(t[w], t.get(1)) for w in multi] + [ratio(k[w], t[w]) for w in multi]
    print("| " + " | ".join(cells) + " |")
    for w in multi:
        if wire == "f32" and k.get(1) and k[w]:
            total += 1
            faster = t[w] is None or k[w]["samples_per_s"] > t[w]["samples_per_s"]
            need = 1.95 if w == 2 else 0.95 * w
            met += k[w]["samples_per_s"] >= need * k[1]["samples_per_s"] and faster
print("\n1 GPU: kiln-run -n 1 / torchrun --nproc-per-node 1 (NCCL in a world of 1, the code path of 2 GPUs); "
      "batch 1024 per GPU; Adam; median of 3 windows.")
apart = [r for r in rows if r["ddp"] and not r.get("reducer", True)]
if apart:
    print("kiln on 2 GPUs without the all-reduce (the compute-only bound): " + "; ".join(
        f"{r['model']} {r['precision']} {r['samples_per_s']:,.0f}/s "
        f"({ratio(r, get('kiln', r['model'], r['precision'], 'f32', 1))} of 1 GPU)" for r in apart))
alone = [r for r in rows if not r["ddp"]]
if alone:
    print("Without a launcher (1 GPU, no DDP): " + "; ".join(
        f"{r['bench']} {r['model']} {r['precision']} {r['samples_per_s']:,.0f}/s" for r in alone))
modes = sorted({f"{r['mode']}" + (f" ({r['note']})" if r.get("note") else "") for r in rows if r["bench"] == "torch"})
if modes:
    print("PyTorch steps: " + "; ".join(modes))
devices = sorted({r["device"] for r in rows})
print(f"Devices: {', '.join(devices)}. "
      f"Rows and worlds with scaling >= 1.95x (2 GPUs) or 0.95x the GPUs (4 and more) and more samples/s "
      f"than DDP: {met} of {total}.")
PY
