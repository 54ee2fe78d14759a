#!/usr/bin/env python3
"""PyTorch twin of bench_ops (tools/bench/bench_ops.cpp): the same rows, units and JSON
shape, measured with torch.cuda.Event (median of --reps runs after two warm-ups), so one
GPU session can run both and divide row by row:

    build/tools/bench_ops > kiln.txt; python3 tools/bench/bench_ops_torch.py > torch.txt

Exits 77 without torch or a CUDA device.
"""
import argparse
import json
import sys
import time

N = 1 << 28
MAT = 4096


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=10)
    reps = max(1, ap.parse_args().reps)
    try:
        import torch
    except ImportError as e:
        print(f"bench_ops_torch: PyTorch is not installed ({e})")
        return 77
    if not torch.cuda.is_available():
        print("bench_ops_torch: no CUDA device, nothing to measure")
        return 77
    dev = torch.device("cuda", 0)
    rows = []

    def time_ms(body):
        for _ in range(2):
            body()
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ms = []
        for _ in range(reps):
            start.record()
            body()
            stop.record()
            stop.synchronize()
            ms.append(start.elapsed_time(stop))
        ms.sort()
        return ms[len(ms) // 2]

    def add_row(name, dtype, unit, ms, value, ratio=None, label=""):
        rows.append({"name": name, "dtype": dtype, "unit": unit, "ms": ms, "value": value, "ratio": ratio})
        extra = f" {label} {ratio:.3f}" if ratio is not None else ""
        print(f"{name:<10} {dtype:<10} {ms:10.4f} {value:12.2f} {unit:<8}{extra}", flush=True)

    def measure(name, dtype, unit, work, body, ref=None, label=""):
        ms = time_ms(body)
        value = work / (ms * 1e-3)
        add_row(name, dtype, unit, ms, value, None if ref is None else value / ref, label)
        return value

    props = torch.cuda.get_device_properties(dev)
    print(f"bench_ops_torch (torch {torch.__version__}) on {props.name} (sm_{props.major}{props.minor}), "
          f"median of {reps} runs")
    print(f"{'op':<10} {'dtype':<10} {'ms':>10} {'value':>12} {'unit':<8} ratio")

    nbytes = N * 4
    src = torch.zeros(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy_gbs = measure("copy", "bytes", "GB/s", 2 * nbytes / 1e9, lambda: dst.copy_(src))
    del src, dst

    names = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
    for dt, dn in names.items():
        sz = torch.tensor([], dtype=dt).element_size()
        x = torch.randn(N, dtype=dt, device=dev)
        y = torch.randn(N, dtype=dt, device=dev)
        frac = dict(ref=copy_gbs, label="of copy")
        measure("add", dn, "GB/s", 3 * N * sz / 1e9, lambda: torch.add(x, y), **frac)
        measure("mul", dn, "GB/s", 3 * N * sz / 1e9, lambda: torch.mul(x, y), **frac)
        measure("relu", dn, "GB/s", 2 * N * sz / 1e9, lambda: torch.relu(x), **frac)
        for to, tn in names.items():
            if to == dt:
                continue
            tsz = torch.tensor([], dtype=to).element_size()
            measure("cast", f"{dn}->{tn}", "GB/s", N * (sz + tsz) / 1e9, lambda: x.to(to), **frac)
        measure("sum", dn, "GB/s", N * sz / 1e9, lambda: torch.sum(x), **frac)
        del x, y

    flop = 2.0 * MAT ** 3 / 1e12
    for label, dt, tf32 in (("f32", torch.float32, False), ("tf32", torch.float32, True),
                            ("bf16", torch.bfloat16, False), ("f16", torch.float16, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(MAT, MAT, dtype=dt, device=dev)
        b = torch.randn(MAT, MAT, dtype=dt, device=dev)
        measure("matmul", label, "TFLOP/s", flop, lambda: torch.matmul(a, b))
    torch.backends.cuda.matmul.allow_tf32 = False

    # Host microseconds per launch-bound op, as bench_ops: batches of 256 adds (fewer than the
    # launch queue holds, so the host never waits for the GPU), synchronised between batches,
    # median batch; then 10000 adds in a row ("sustained", bounded by host or GPU).
    def host_us(body, batch, batches):
        us = []
        for rep in range(2 + batches):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(batch):
                body()
            t1 = time.perf_counter()
            if rep >= 2:
                us.append((t1 - t0) * 1e6 / batch)
        torch.cuda.synchronize()
        us.sort()
        return us[len(us) // 2]

    for grad in (False, True):
        x = torch.ones(1, device=dev, requires_grad=grad)
        v = host_us(lambda: torch.add(x, x), 256, 40)
        add_row("overhead", "autograd" if grad else "no_grad", "us/op", v * 0.256, v)
    x = torch.ones(1, device=dev)
    v = host_us(lambda: torch.add(x, x), 10000, max(1, reps // 2))
    add_row("overhead", "sustained", "us/op", v * 10, v)

    print(json.dumps({"bench": "torch", "version": torch.__version__, "device": props.name,
                      "copy_gbs": copy_gbs, "rows": rows}, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
