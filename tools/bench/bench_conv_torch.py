#!/usr/bin/env python3
"""PyTorch (cuDNN) twin of bench_conv (tools/bench/bench_conv.cpp): the same shapes (by
default the MNIST cnn's conv1 and conv2 at batch 128, the speedrun's sr1 and sr2 at batch
256, conv2_b1024, conv2 at batch 1024, and res64, res128 and proj256 at batch 64), precisions and ops, timed the same way (median
microseconds per call over --reps event-timed batches of --calls calls, after --warmup
untimed batches; launched one by one, and as a CUDA graph of --calls calls replayed per batch),
with torch.backends.cudnn.benchmark on:

    conv2d              torch.nn.functional.conv2d (no bias)
    conv2d_grad_input   aten.convolution_backward with output_mask (True, False, False)
    conv2d_grad_weight  aten.convolution_backward with output_mask (False, True, False)

bf16 runs bf16 tensors; tf32 and f32 run f32 with torch.backends.cudnn.allow_tf32 on and
off. With --kiln FILE (bench_conv's output or its --json file) the shapes and precisions
default to that run's, and the table sets kiln beside cuDNN with the throughput ratio
kiln/cuDNN per row (issue 11 asks for >= 1 on every row), launched one by one and, where both
runs have them, as replayed graphs (what a compiled step pays: the host's launches, which
decide the small rows eagerly, are left out on both sides):

    build/tools/bench_conv --json kiln_conv.json
    python3 tools/bench/bench_conv_torch.py --kiln kiln_conv.json

--markdown FILE also writes the README's table from the run. --cudnn FILE takes an earlier run
of this script (its output or --json file) instead of measuring, so the table and the
comparison need neither torch nor a GPU:

    python3 tools/bench/bench_conv_torch.py --kiln kiln_conv.json --cudnn torch_conv.txt --markdown table.md

Exits 77 without torch or a CUDA device.
"""
import argparse
import json
import sys
import time

OPS = ("conv2d", "conv2d_grad_input", "conv2d_grad_weight")
PRECISIONS = ("bf16", "tf32", "f32")
# bench_conv's kCnnShapes, names included: rows are matched by spec, shown by name.
CNN_SHAPES = (("conv1", "128,1,28,28,32,5,5,1,2"), ("conv2", "128,32,14,14,64,5,5,1,2"),
              ("sr1", "256,1,28,28,24,5,5,1,0"), ("sr2", "256,24,12,12,32,3,3,1,0"),
              ("conv2_b1024", "1024,32,14,14,64,5,5,1,2"), ("res64", "64,64,56,56,64,3,3,1,1"),
              ("res128", "64,128,28,28,128,3,3,1,1"), ("proj256", "64,256,56,56,64,1,1,1,0"))


def parse_shape(text):
    """'N,C,H,W,O,kh,kw,stride,pad' -> a dict of those sizes, or ValueError."""
    fields = text.split(",")
    try:
        v = [int(f) for f in fields]
    except ValueError:
        raise ValueError(f'[bench_conv_torch] --shape "{text}": every field must be an integer') from None
    if len(v) != 9:
        raise ValueError(f'[bench_conv_torch] --shape "{text}" needs 9 values N,C,H,W,O,kh,kw,stride,pad')
    s = dict(zip(("n", "c", "h", "w", "o", "kh", "kw", "stride", "pad"), v))
    if min(v[:8]) < 1 or s["pad"] < 0:
        raise ValueError(f'[bench_conv_torch] --shape "{text}": sizes and stride must be >= 1, pad >= 0')
    if s["kh"] > s["h"] + 2 * s["pad"] or s["kw"] > s["w"] + 2 * s["pad"]:
        raise ValueError(f'[bench_conv_torch] --shape "{text}": the kernel is larger than the padded input')
    s["oh"] = (s["h"] + 2 * s["pad"] - s["kh"]) // s["stride"] + 1
    s["ow"] = (s["w"] + 2 * s["pad"] - s["kw"]) // s["stride"] + 1
    s["spec"] = ",".join(str(x) for x in v)
    return s


def flop(s):
    return 2.0 * s["n"] * s["o"] * s["oh"] * s["ow"] * s["c"] * s["kh"] * s["kw"]


def read_line(path, bench, tool):
    """The last JSON line of `bench` in a file (a --json file, or a run's stdout)."""
    doc = None
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("{") and json.loads(line).get("bench") == bench:
                    doc = json.loads(line)
    except (OSError, ValueError) as e:
        raise ValueError(f"[bench_conv_torch] cannot read {path}: {e}") from None
    if doc is None:
        raise ValueError(f"[bench_conv_torch] {path} holds no {tool} JSON line")
    return doc


def read_kiln(path):
    """bench_conv's JSON line (its --json file, or its stdout)."""
    return read_line(path, "kiln_conv", "bench_conv")


def op_calls(torch, s, x, w, gy):
    """The three ops of one shape, each a no-argument call returning the result."""
    F, aten = torch.nn.functional, torch.ops.aten
    st, pad = [s["stride"]] * 2, [s["pad"]] * 2

    def backward(mask):
        return aten.convolution_backward(gy, x, w, None, st, pad, [1, 1], False, [0, 0], 1, mask)

    return {"conv2d": lambda: F.conv2d(x, w, None, st, pad),
            "conv2d_grad_input": lambda: backward([True, False, False])[0],
            "conv2d_grad_weight": lambda: backward([False, True, False])[1]}


def ratio_of(cudnn, kiln, key):
    """cuDNN's time over kiln's under `key` ("us" or "graph_us"), or None where either lacks it."""
    c, k = (cudnn or {}).get(key), (kiln or {}).get(key)
    return c / k if c and k else None


def compare(rows, kiln):
    """Prints kiln beside cuDNN per row, launched one by one and as replayed graphs; returns the
    rows where kiln's throughput is below cuDNN's, as graphs where both runs timed them."""
    by_key = {(r["shape"], r["precision"], r["op"]): r for r in kiln["rows"]}
    nan = float("nan")
    print(f"kiln on {kiln.get('device', '?')} beside cuDNN; ratio = kiln TFLOP/s / cuDNN TFLOP/s, launched one "
          f"by one and as replayed graphs")
    print(f"{'name':<11} {'prec':<5} {'op':<19} {'kiln us':>9} {'cudnn us':>9} {'ratio':>6} {'kiln g':>9} "
          f"{'cudnn g':>9} {'g ratio':>7}")
    short, eager_short, graphs = [], 0, 0
    for r in rows:
        k = by_key.get((r["shape"], r["precision"], r["op"]))
        eager, graph = ratio_of(r, k, "us"), ratio_of(r, k, "graph_us")
        graphs += graph is not None
        eager_short += eager is None or eager < 1
        decides = graph if graph is not None else eager
        if decides is None or decides < 1:
            short.append(r)
        print(f"{r['name']:<11} {r['precision']:<5} {r['op']:<19} {(k or {}).get('us') or nan:>9.2f} "
              f"{r['us'] or nan:>9.2f} {eager or nan:>6.2f} {(k or {}).get('graph_us') or nan:>9.2f} "
              f"{r.get('graph_us') or nan:>9.2f} {graph or nan:>7.2f}"
              f"{'' if decides is not None and decides >= 1 else '  below cuDNN'} {(k or {}).get('note', '')}")
    print(f"kiln reaches cuDNN's throughput on {len(rows) - eager_short} of {len(rows)} rows launched one by one")
    if graphs:
        print(f"kiln reaches cuDNN's throughput on {len(rows) - len(short)} of {len(rows)} rows as replayed graphs")
    return short


# The README's names for bench_conv's default shapes.
README_NAMES = {"conv1": "cnn conv1", "conv2": "cnn conv2", "sr1": "speedrun conv1", "sr2": "speedrun conv2",
                "conv2_b1024": "cnn conv2", "res64": "res64", "res128": "res128", "proj256": "proj256"}


def markdown(rows, kiln):
    """The README's convolution table: per shape and op, 'kiln us / cuDNN us (cuDNN/kiln)' in bf16,
    TF32 and exact f32, as replayed graphs where both runs timed them (else launched one by one);
    then the kiln run's first calls (their tuning, with KILN_TUNE=on)."""
    by_key = {(r["shape"], r["precision"], r["op"]): r for r in kiln["rows"]}
    cudnn = {(r["shape"], r["precision"], r["op"]): r for r in rows}
    passes = (("conv2d", "forward"), ("conv2d_grad_input", "input grad"), ("conv2d_grad_weight", "weight grad"))
    out = ["| conv | pass | bf16 | TF32 | exact f32 |", "| --- | --- | --- | --- | --- |"]
    shapes = list(dict.fromkeys((r["name"], r["shape"]) for r in rows))
    for name, spec in shapes:
        s = parse_shape(spec)
        label = (f"{README_NAMES.get(name, name)} {s['c']}\u2192{s['o']} {s['kh']}x{s['kw']}, "
                 f"{s['n']}x{s['h']}\u00b2")
        for op, pass_name in passes:
            cells = []
            for prec in PRECISIONS:
                k, c = by_key.get((spec, prec, op)), cudnn.get((spec, prec, op))
                key = "graph_us" if ratio_of(c, k, "graph_us") else "us"
                if ratio_of(c, k, key):
                    cells.append(f"{k[key]:.1f} / {c[key]:.1f} ({c[key] / k[key]:.2f}x)")
                else:
                    cells.append("n/a")
            out.append(f"| {label} | {pass_name} | " + " | ".join(cells) + " |")
    first = [r["first_ms"] for r in kiln["rows"] if r.get("first_ms") is not None and r["first_ms"] >= 0]
    if first:
        out.append("")
        out.append(f"first calls: {sum(first) / len(first):.0f} ms on average, at most {max(first):.0f} ms, "
                   f"{sum(f > 1000 for f in first)} of {len(first)} over 1 s")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", action="append", help="N,C,H,W,O,kh,kw,stride,pad (repeatable)")
    ap.add_argument("--precision", action="append", choices=PRECISIONS, help="repeatable; default: all")
    ap.add_argument("--reps", type=int, default=50, help="event-timed batches per row (median)")
    ap.add_argument("--calls", type=int, default=10, help="calls per timed batch")
    ap.add_argument("--warmup", type=int, default=3, help="untimed batches first (cuDNN autotuning)")
    ap.add_argument("--kiln", help="bench_conv output to compare with")
    ap.add_argument("--json", help="also write the JSON line to this file")
    ap.add_argument("--markdown", help="with --kiln: also write the README's table to this file")
    ap.add_argument("--cudnn", help="with --kiln: this script's earlier run (its output or --json file) to compare "
                                    "and tabulate, measuring nothing (no torch or GPU needed)")
    args = ap.parse_args()
    if (args.markdown or args.cudnn) and not args.kiln:
        ap.error("--markdown and --cudnn need --kiln")
    if args.reps < 1 or args.calls < 1 or args.warmup < 0:
        ap.error("--reps and --calls must be >= 1, --warmup >= 0")
    if args.cudnn:
        try:
            kiln, rows = read_kiln(args.kiln), read_line(args.cudnn, "torch_conv", "bench_conv_torch")["rows"]
        except ValueError as e:
            print(e, file=sys.stderr)
            return 2
        compare(rows, kiln)
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write(markdown(rows, kiln))
        return 0
    try:
        kiln = read_kiln(args.kiln) if args.kiln else None
        if args.shape:
            shapes = [(f"shape{i}", parse_shape(t)) for i, t in enumerate(args.shape)]
        elif kiln:  # the kiln run's shapes, in its order
            names = dict((r["shape"], r["name"]) for r in kiln["rows"])
            shapes = [(name, parse_shape(spec)) for spec, name in names.items()]
        else:
            shapes = [(name, parse_shape(spec)) for name, spec in CNN_SHAPES]
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    precisions = args.precision or ([p for p in PRECISIONS if any(r["precision"] == p for r in kiln["rows"])]
                                    if kiln else list(PRECISIONS))
    try:
        import torch
    except ImportError as e:
        print(f"bench_conv_torch: PyTorch is not installed ({e})")
        return 77
    if not torch.cuda.is_available():
        print("bench_conv_torch: no CUDA device, nothing to measure")
        return 77
    dev = torch.device("cuda", 0)
    torch.backends.cudnn.benchmark = True
    tf32_was = torch.backends.cudnn.allow_tf32

    def median_us(batch, calls):
        """The median microseconds per call of batch() (calls calls) over the timed batches."""
        for _ in range(args.warmup):
            batch()
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ms = []
        for _ in range(args.reps):
            start.record()
            batch()
            stop.record()
            stop.synchronize()
            ms.append(start.elapsed_time(stop))
        ms.sort()
        return ms[len(ms) // 2] * 1e3 / calls

    def eager_us(call):
        def batch():
            for _ in range(args.calls):
                call()

        return median_us(batch, args.calls)

    def graph_us(call):
        """As eager_us, the --calls calls captured once (after the eager timing warmed cuDNN's
        benchmark and the allocator) and replayed per batch."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            call()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(args.calls):
                call()
        return median_us(g.replay, args.calls)

    print(f"bench_conv_torch (torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}) on "
          f"{torch.cuda.get_device_name(0)}: median of {args.reps} batches of {args.calls} calls after "
          f"{args.warmup} warm-up batches")
    print(f"{'name':<11} {'N,C,H,W,O,kh,kw,s,pad':<24} {'prec':<5} {'op':<19} {'us/call':>10} {'graph_us':>10} "
          f"{'TFLOP/s':>9} {'first_ms':>10}  note")
    rows = []
    for name, s in shapes:
        for prec in precisions:
            torch.backends.cudnn.allow_tf32 = prec == "tf32"
            dt = torch.bfloat16 if prec == "bf16" else torch.float32
            x = torch.randn(s["n"], s["c"], s["h"], s["w"], dtype=dt, device=dev)
            w = torch.randn(s["o"], s["c"], s["kh"], s["kw"], dtype=dt, device=dev)
            gy = torch.randn(s["n"], s["o"], s["oh"], s["ow"], dtype=dt, device=dev)
            for op, call in op_calls(torch, s, x, w, gy).items():
                row = {"name": name, "shape": s["spec"], "precision": prec, "op": op, "us": None, "graph_us": None,
                       "tflops": None, "first_ms": None, "note": ""}
                try:
                    t0 = time.perf_counter()
                    call()
                    torch.cuda.synchronize()
                    row["first_ms"] = (time.perf_counter() - t0) * 1e3
                    row["us"] = eager_us(call)
                    row["tflops"] = flop(s) / (row["us"] * 1e-6) / 1e12
                    row["graph_us"] = graph_us(call)
                except Exception as e:  # report why in the row, measure the rest
                    row["note"] = f"failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}"
                rows.append(row)
                nan = float("nan")
                print(f"{name:<11} {s['spec']:<24} {prec:<5} {op:<19} {row['us'] or nan:>10.2f} "
                      f"{row['graph_us'] or nan:>10.2f} {row['tflops'] or nan:>9.2f} {row['first_ms'] or nan:>10.2f}  "
                      f"{row['note']}", flush=True)
    torch.backends.cudnn.allow_tf32 = tf32_was
    if kiln:
        compare(rows, kiln)
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write(markdown(rows, kiln))
    line = json.dumps({"bench": "torch_conv", "version": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                       "device": torch.cuda.get_device_name(0), "reps": args.reps, "calls": args.calls,
                       "rows": rows}, separators=(",", ":"))
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
