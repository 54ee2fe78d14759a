#!/usr/bin/env bash
# Issue 23's data-parallel table on a machine with 2 GPUs, kiln beside PyTorch DDP in one go
# (about 3 minutes with a warm kernel cache): bench_dist alone (1 GPU, no DDP; it also warms the
# kernel cache), under kiln-run -n 1 and -n 2, then bench_dist_torch.py under torchrun with 1 and 2
# processes. The launched runs add each bf16 row with gradients all-reduced in bf16 on both sides
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
run kiln_n1 "$launch" -n 1 -- "$bench" "${common[@]}" "${extra[@]}"
run kiln_n2 "$launch" -n 2 -- "$bench" "${common[@]}" "${extra[@]}"
torchrun=(python3 -m torch.distributed.run --standalone)
tcommon=(tools/bench/bench_dist_torch.py --steps "$steps" --json "$out/torch.jsonl")
if [ $torch_ok = 1 ]; then
  run torch_n1 "${torchrun[@]}" --nproc-per-node 1 "${tcommon[@]}" "${extra[@]}"
  run torch_n2 "${torchrun[@]}" --nproc-per-node 2 "${tcommon[@]}" "${extra[@]}"
  [ "${BENCH_DIST_TORCH_SINGLE:-0}" = 1 ] && run torch_alone python3 "${tcommon[@]}"
fi
if [ "${BENCH_DIST_DIAG:-0}" = 1 ]; then
  run kiln_n2_no_reducer "$launch" -n 2 -- "$bench" "${common[@]}" --no-reducer
fi

python3 - "$out" <<'PY'
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
print("\n| model | precision | kiln 1 GPU | kiln 2 GPUs | scaling | DDP 1 GPU | DDP 2 GPUs | DDP scaling "
      "| kiln/DDP at 2 GPUs |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
met = total = 0
for model, prec, wire in keys:
    k1, k2 = get("kiln", model, prec, wire, 1), get("kiln", model, prec, wire, 2)
    t1, t2 = get("torch", model, prec, wire, 1), get("torch", model, prec, wire, 2)
    label = prec + (", bf16 gradients" if wire == "bf16" else "")
    print(f"| {model} | {label} | {rate(k1)} | {rate(k2)} | {ratio(k2, k1)} | {rate(t1)} | {rate(t2)} | "
          f"{ratio(t2, t1)} | {ratio(k2, t2)} |")
    if wire == "f32" and k1 and k2:
        total += 1
        faster = t2 is None or k2["samples_per_s"] > t2["samples_per_s"]
        met += k2["samples_per_s"] >= 1.95 * k1["samples_per_s"] and faster
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
      f"Rows with scaling >= 1.95x and more samples/s than DDP at 2 GPUs: {met} of {total}.")
PY
