#!/usr/bin/env python3
"""PyTorch twin of bench_gemm (tools/bench/bench_gemm.cpp): the rows of its JSON (--kiln FILE,
its --json file or its stdout), each timed in PyTorch the same way (median microseconds per call
over --reps event-timed batches of --calls calls, after 2 untimed batches; eager, and replayed
as one CUDA graph per batch), then the table: kiln, cuBLASLt's best algorithm and PyTorch per
row, with lt_best/kiln (the issue asks >= 0.97 on every training product, >= 0.95 for 8192^3
bf16) and torch/kiln, kiln and PyTorch each as a replayed graph (what a compiled step pays).

    fwd     torch.nn.functional.linear(x, w, b)
    dgrad   gp @ w
    wgrad   gp.t() @ x and gp.sum(0), as autograd takes linear's weight and bias gradients
    square  a @ b

f32 runs with torch.backends.cuda.matmul.allow_tf32 off, tf32 with it on, bf16 on bf16 tensors.

    build/tools/bench_gemm --json kiln_gemm.json
    python3 tools/bench/bench_gemm_torch.py --kiln kiln_gemm.json

Exits 77 without torch or a CUDA device.
"""
import argparse
import json
import sys


def read_kiln(path):
    """bench_gemm's JSON line: the file itself, or the last line of it that starts with '{'."""
    with open(path) as f:
        lines = [line for line in f.read().splitlines() if line.startswith("{")]
    if not lines:
        raise ValueError(f"[bench_gemm_torch] {path} holds no JSON line from bench_gemm")
    return json.loads(lines[-1])


def timed_us(torch, body, reps, calls):
    """Median microseconds per call of body() over reps event-timed batches of calls."""
    for _ in range(2):
        body()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(reps):
        start.record()
        for _ in range(calls):
            body()
        stop.record()
        stop.synchronize()
        ms.append(start.elapsed_time(stop))
    ms.sort()
    return ms[len(ms) // 2] * 1e3 / calls


def graph_us(torch, body, reps, calls):
    """timed_us of one CUDA graph holding calls calls of body(), per call."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            body()  # warm-up outside the capture (cuBLAS workspaces, allocator)
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            body()
    return timed_us(torch, g.replay, reps, 1) / calls


def torch_call(torch, op, batch, n_in, n_out, dtype):
    """The row's PyTorch call on fresh operands of its sizes."""
    F = torch.nn.functional
    r = lambda *shape: torch.randn(*shape, device="cuda", dtype=dtype)
    if op == "fwd":
        x, w, b = r(batch, n_in), r(n_out, n_in), r(n_out)
        return lambda: F.linear(x, w, b)
    if op == "dgrad":
        gp, w = r(batch, n_out), r(n_out, n_in)
        return lambda: gp @ w
    if op == "wgrad":
        gp, x = r(batch, n_out), r(batch, n_in)
        return lambda: (gp.t() @ x, gp.sum(0))
    a, b = r(batch, n_in), r(n_in, n_out)
    return lambda: a @ b


def cell(v, fmt="{:.2f}"):
    return "n/a" if v is None else fmt.format(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kiln", required=True, help="bench_gemm's --json file or stdout")
    ap.add_argument("--reps", type=int, default=None, help="default: the kiln run's")
    ap.add_argument("--calls", type=int, default=None, help="default: the kiln run's")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("bench_gemm_torch: no torch, nothing to measure")
        return 77
    if not torch.cuda.is_available():
        print("bench_gemm_torch: no CUDA device, nothing to measure")
        return 77
    kiln = read_kiln(args.kiln)
    reps, calls = args.reps or kiln["reps"], args.calls or kiln["calls"]
    print(f"bench_gemm_torch on {torch.cuda.get_device_name(0)}, torch {torch.__version__}; kiln run on {kiln['device']}")
    head = ("model", "batch,in,out", "op", "prec", "kiln_us", "graph_us", "lt_us", "torch_us", "t_graph",
            "lt/kiln", "torch/kiln")
    row_format = "{:<8} {:<16} {:<6} {:<5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>10}"
    print(row_format.format(*head))
    out = []
    for row in kiln["rows"]:
        batch, n_in, n_out = (int(v) for v in row["spec"].split(","))
        prec = row["precision"]
        torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
        dtype = torch.bfloat16 if prec == "bf16" else torch.float32
        call = torch_call(torch, row["op"], batch, n_in, n_out, dtype)
        t_us, tg_us = timed_us(torch, call, reps, calls), graph_us(torch, call, reps, calls)
        k_us, kg_us, l_us = row["kiln_us"], row.get("graph_us"), row["lt_best_us"]
        lt_ratio = l_us / kg_us if kg_us and l_us else None
        torch_ratio = tg_us / kg_us if kg_us else None
        print(row_format.format(row["model"], row["spec"], row["op"], prec, cell(k_us), cell(kg_us), cell(l_us),
                                cell(t_us), cell(tg_us), cell(lt_ratio), cell(torch_ratio)))
        out.append(dict(row, torch_us=t_us, torch_graph_us=tg_us, lt_over_kiln=lt_ratio, torch_over_kiln=torch_ratio))
    training = [r["lt_over_kiln"] for r in out if r["model"] != "square" and r["lt_over_kiln"] is not None]
    if training:
        low = sum(1 for v in training if v < 0.97)
        print(f"training products: lt/kiln from {min(training):.2f} to {max(training):.2f}; {low} of {len(training)} below 0.97")
    print(json.dumps({"bench": "torch_gemm", "torch": torch.__version__, "rows": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
