#!/usr/bin/env python3
"""Replays what kiln_difftest wrote (manifest.json + cases-*.safetensors) in PyTorch and
compares values and gradients: per-dtype relative + absolute tolerances, NaN and Inf in the
same places, exact integers and bools. Every registry op needs an entry in difftest_ops.py;
deliberate differences are the KNOWN table of difftest_known.py (each stated in the README).

    python3 tools/difftest/torch_difftest.py OUTDIR [--device cuda] [--ops add,matmul] [--jobs 16]

Prints the first mismatches per op and `difftest: N cases, N passed, N failed, N known
differences`; exits 1 on any unexplained failure."""
import argparse
import json
import multiprocessing
import os
import sys
import warnings
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402

from difftest_known import explain  # noqa: E402
from difftest_ops import CREATION, DTYPES, GRAD_MAGNITUDE, MAGNITUDE, OPS, RANDOM  # noqa: E402

# (rtol, atol) of values; gradients get GRAD_SCALE times more (kiln composes them from
# public ops, each rounding in the storage dtype, where PyTorch fuses).
TOLERANCE = {"f64": (1e-9, 1e-12), "f32": (2e-5, 1e-6), "f16": (2e-3, 1e-3), "bf16": (1.6e-2, 8e-3)}
GRAD_SCALE = 8


def decode_attrs(attrs, device):
    out = {}
    for k, tv in attrs.items():
        t, v = tv["t"], tv["v"]
        if t == "float":
            v = float(v)
        elif t == "dtype":
            v = DTYPES[v]
        elif t == "device":
            v = torch.device(device if v == "cuda" else "cpu")
        out[k] = v
    return out


class Mismatch:
    def __init__(self, what, kind, detail, mask=None):
        self.what, self.kind, self.detail, self.mask = what, kind, detail, mask  # what: "out0", "grad1"


def compare(what, kiln, ref, dtype_name, scale, magnitude=None):
    """Mismatch or None. kiln and ref are CPU tensors; ref's dtype must be kiln's. `magnitude`
    (f64, ref's shape) bounds the terms of a sum: its rounding error is relative to that, and
    where it passes the dtype's max, partial sums may overflow in one order and not another."""
    if ref.dtype != DTYPES[dtype_name]:
        return Mismatch(what, "dtype", f"kiln {dtype_name}, torch {str(ref.dtype).replace('torch.', '')}")
    if tuple(ref.shape) != tuple(kiln.shape):
        return Mismatch(what, "shape", f"kiln {list(kiln.shape)}, torch {list(ref.shape)}")
    if not ref.is_floating_point():
        bad = kiln != ref
    else:
        a, b = kiln.double(), ref.double()
        rtol, atol = (t * scale for t in TOLERANCE[dtype_name])
        size = b.abs() if magnitude is None else torch.maximum(b.abs(), magnitude.nan_to_num(0, 0, 0))
        na, nb = torch.isnan(a), torch.isnan(b)
        inf = torch.isinf(a) | torch.isinf(b)
        close = (a - b).abs() <= atol + rtol * size
        bad = (na != nb) | (~na & ~nb & torch.where(inf, a != b, ~close))
        if magnitude is not None:
            bad &= ~(magnitude > torch.finfo(ref.dtype).max)
    if not bad.any():
        return None
    idx = bad.nonzero()[:4].tolist()
    shown = ", ".join(f"{tuple(i)}: kiln {kiln[tuple(i)].item()!r} torch {ref[tuple(i)].item()!r}" for i in idx)
    m = Mismatch(what, "values", f"{int(bad.sum())}/{bad.numel()} differ; {shown}", bad)
    m.kiln, m.ref = kiln, ref
    return m


def magnitude_of(fn, ins, attrs):
    """The op's MAGNITUDE, or None where it has none or it does not apply (mixed dtypes)."""
    try:
        return fn(*[t.detach().cpu() for t in ins], attrs) if fn else None
    except RuntimeError:
        return None


def torch_inputs(case, tensors, device):
    ins = []
    for i, spec in enumerate(case["inputs"]):
        base = tensors[f"in{i}"].to(device).clone()
        view = spec.get("view")
        ins.append(base.as_strided(spec["shape"], view["strides"], view["offset"]) if view
                   else base.reshape(spec["shape"]))
    return ins


def leaves(case, ins):
    return [x.detach().requires_grad_() if s["grad"] else x for x, s in zip(ins, case["inputs"])]


# Ops whose index inputs PyTorch checks on CUDA with a device-side assert, which leaves the
# process's CUDA context unusable: they run on the CPU first, where the same check raises.
INDEXED = {"gather", "index_select", "scatter_add", "one_hot", "nll_loss", "nll_loss_backward",
           "max_pool2d_backward"}


def cpu_refusal(case, tensors, adapt):
    """PyTorch's CPU error for the case (its forward), or None when the CPU accepts it."""
    attrs = decode_attrs(case["attrs"], "cpu")
    fn, args = OPS[case["op"]], leaves(case, torch_inputs(case, tensors, "cpu"))
    if adapt:
        fn, args = adapt(fn, args, attrs)
    try:
        fn(*args, attrs)
    except Exception as e:  # noqa: BLE001 - any refusal counts, as in run_case
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return None


def run_case(case, tensors, device, adapt=None):
    """(mismatches, inputs) of one case. `adapt(fn, inputs, attrs) -> (fn, inputs)` replays
    it under one of kiln's documented rules (difftest_known.py); outputs and gradients are
    then cast to kiln's dtypes before comparing."""
    op = case["op"]
    attrs = decode_attrs(case["attrs"], device)
    ins = torch_inputs(case, tensors, device)
    kiln_outs = [tensors[f"out{k}"] for k in range(len(case["outputs"]))]
    if op in RANDOM:
        err = RANDOM[op](kiln_outs, [t.cpu() for t in ins], attrs)
        return ([Mismatch("out0", "property", err)] if err else []), ins
    fn = OPS[op]
    if op in CREATION:
        fn = (lambda f: lambda *a: f(a[-1], device))(fn)
    args = leaves(case, ins)
    if adapt:
        fn, args = adapt(fn, args, attrs)
    if device != "cpu" and op in INDEXED:
        refused = cpu_refusal(case, tensors, adapt)
        if refused:
            return [Mismatch("out0", "torch raised", refused)], ins
    try:
        outs = fn(*args, attrs)
    except Exception as e:  # noqa: BLE001 - any refusal by PyTorch is reported as the case's failure
        return [Mismatch("out0", "torch raised", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")], ins
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    cast = (lambda t, d: t.to(DTYPES[d])) if adapt else (lambda t, d: t)
    scale = case["tolerance_scale"]
    magnitude = MAGNITUDE.get(op)
    found = []
    for k, spec in enumerate(case["outputs"]):
        mag = magnitude_of(magnitude, ins, attrs) if k == 0 else None
        m = compare(f"out{k}", kiln_outs[k], cast(outs[k].detach().cpu(), spec["dtype"]), spec["dtype"], scale, mag)
        if m:
            found.append(m)
    wants = [i for i, s in enumerate(case["inputs"]) if s["grad"]]
    roots = [(outs[k], tensors[f"cot{k}"].to(device).to(outs[k].dtype)) for k, s in enumerate(case["outputs"])
             if s["cotangent"] and outs[k].requires_grad]
    if wants and roots and not found:
        grads = torch.autograd.grad([r for r, _ in roots], [args[i] for i in wants], [c for _, c in roots],
                                    allow_unused=True)
        # The loosest tolerance of the dtypes involved: a gradient computes in the output's.
        loosest = max([case["inputs"][i]["dtype"] for i in wants] + [s["dtype"] for s in case["outputs"]
                      if s["dtype"] in TOLERANCE], key=lambda d: TOLERANCE[d][0])
        for i, g in zip(wants, grads):
            g = torch.zeros_like(args[i]) if g is None else g
            dt = case["inputs"][i]["dtype"]
            gmag = magnitude_of(GRAD_MAGNITUDE.get(op), [ins[0], tensors["cot0"], kiln_outs[0]], attrs) if i == 0 else None
            m = compare(f"grad{i}", tensors[f"grad{i}"], cast(g.detach().cpu(), dt), dt,
                        scale * GRAD_SCALE * TOLERANCE[loosest][0] / TOLERANCE[dt][0], gmag)
            if m:
                found.append(m)
    return found, ins


_files = {}


def load(outdir, case):
    """The case's tensors by their name after "caseNNNNN." (in0, out0, cot0, grad0)."""
    if case["file"] not in _files:
        f = safe_open(os.path.join(outdir, case["file"]), framework="pt")
        index = defaultdict(list)
        for k in f.keys():
            index[k.split(".")[0]].append(k)
        _files[case["file"]] = (f, index)
    f, index = _files[case["file"]]
    return {k.split(".")[1]: f.get_tensor(k) for k in index[case["id"]]}


def check_op(job):
    """Counts and report lines for one op's cases."""
    outdir, device, op, cases, shown = job
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=UserWarning)  # var with correction >= N, as the case asks
    # kiln's GEMMs and convolutions run in full f32 unless asked; so must PyTorch's.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    r = {"op": op, "passed": 0, "failed": 0, "known": 0, "lines": [], "known_reasons": defaultdict(int)}
    for case in cases:
        tensors = load(outdir, case)
        try:
            found, ins = run_case(case, tensors, device)
        except Exception as e:  # noqa: BLE001
            found, ins = [Mismatch("case", "error", f"{type(e).__name__}: {e}")], []
        if not found:
            r["passed"] += 1
            continue
        reasons = explain(case, [t.detach().cpu() for t in ins], tensors, found,
                          lambda adapt: run_case(case, tensors, device, adapt)[0])
        if reasons:
            r["known"] += 1
            for reason in reasons:
                r["known_reasons"][reason] += 1
            continue
        r["failed"] += 1
        if r["failed"] <= shown:
            r["lines"].append(f"  FAIL {case['id']} {case['name']}")
            r["lines"] += [f"    {m.what} {m.kind}: {m.detail}" for m in found]
    r["known_reasons"] = dict(r["known_reasons"])
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--ops", default="", help="comma-separated op names (default: every op in the manifest); "
                    "--ops=NAMES also filters kiln_difftest in run.sh")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--show", type=int, default=3, help="failing cases printed per op (4 elements each)")
    ap.add_argument("--verbose", action="store_true", help="a line for every op, not only failing ones")
    args = ap.parse_args()
    with open(os.path.join(args.outdir, "manifest.json")) as f:
        manifest = json.load(f)
    only = set(filter(None, args.ops.split(",")))
    ops = {k: v for k, v in manifest["ops"].items() if not only or k in only}

    failed_ops = []
    for op, entry in ops.items():
        if op not in OPS and op not in RANDOM:
            failed_ops.append(f"{op}: no PyTorch entry in difftest_ops.py ({len(entry['cases'])} cases not compared)")
        elif not entry["cases"]:
            failed_ops.append(f"{op}: kiln rejected every case ({entry['rejected'][0]['error'] if entry['rejected'] else 'none generated'})")
    jobs = [(args.outdir, args.device, op, e["cases"], args.show) for op, e in ops.items() if (op in OPS or op in RANDOM) and e["cases"]]
    jobs.sort(key=lambda j: -len(j[3]))
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(args.jobs) as pool:
        results = list(pool.imap_unordered(check_op, jobs))
    results.sort(key=lambda r: r["op"])

    totals = defaultdict(int)
    known = defaultdict(int)
    for r in results:
        for k in ("passed", "failed", "known"):
            totals[k] += r[k]
        for reason, n in r["known_reasons"].items():
            known[reason] += n
        if r["failed"] or args.verbose:
            print(f"{r['op']}: {r['passed']} passed, {r['failed']} failed, {r['known']} known")
            print("\n".join(r["lines"]))
    for line in failed_ops:
        print("FAIL " + line)
    for reason, n in sorted(known.items()):
        print(f"known difference ({n} cases): {reason}")
    n = totals["passed"] + totals["failed"] + totals["known"]
    failed = totals["failed"] + len(failed_ops)
    print(f"difftest: {n} cases, {totals['passed']} passed, {failed} failed, {totals['known']} known differences")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
