#!/usr/bin/env python3
"""PyTorch DDP twin of bench_dist (tools/bench/bench_dist.cpp): the same models (the wide MLP
784-4096-4096-10 and the trainer's cnn), Adam (lr 1e-3), batch per GPU, precisions, timing and
JSON lines, with DistributedDataParallel under torchrun:

    torchrun --standalone --nproc-per-node {1,2} tools/bench/bench_dist_torch.py \\
        [--model mlp4096|cnn|all] [--precision f32,tf32,bf16] [--steps N] [--json FILE]

Without a launcher it trains on cuda:0 without DDP. PyTorch in its best mode for DDP: the whole
step (forward, backward with DDP's bucketed all-reduces, fused capturable Adam) captured with
torch.cuda.graph as the PyTorch CUDA-graph notes describe for DDP (TORCH_NCCL_ASYNC_ERROR_HANDLING=0,
DDP made on a side stream, >= 11 eager DDP steps before the capture), DDP with
gradient_as_bucket_view and static_graph; each replay copies the batch in, as kiln's compiled
call does. --mode auto (the default) falls back to eager steps when the capture fails on any
rank, and the row says so in "mode" and "note". broadcast_buffers is off: kiln does not sync the
cnn's batch-norm statistics either. cudnn.benchmark is on.
Precisions: f32 with TF32 off for matmuls and cuDNN, tf32 with both on, bf16 with forward and
loss under torch.autocast (TF32 off). --grad-bf16 registers DDP's bf16_compress_hook.
Exits 77 without torch or a CUDA device, 2 on bad arguments.
"""
import argparse
import json
import os
import statistics
import sys
import time

MODELS = ("mlp4096", "cnn")
PRECISIONS = ("f32", "tf32", "bf16")


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="bench_dist_torch", description="PyTorch DDP twin of bench_dist")
    ap.add_argument("--model", default="all", help="mlp4096, cnn or all (comma-separated)")
    ap.add_argument("--precision", default="all", help="f32, tf32, bf16 or all (comma-separated)")
    ap.add_argument("--steps", type=int, default=100, help="timed steps per window")
    ap.add_argument("--repeats", type=int, default=3, help="timed windows; the median is reported")
    ap.add_argument("--warmup", type=int, default=10, help="steps (replays) before timing, after the capture")
    ap.add_argument("--eager-warmup", type=int, default=12, help="eager DDP steps before the capture (>= 11)")
    ap.add_argument("--batch", type=int, default=1024, help="batch per GPU")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mode", choices=["auto", "graph", "eager"], default="auto")
    ap.add_argument("--grad-bf16", action="store_true", help="DDP's bf16_compress_hook")
    ap.add_argument("--bf16-grads-row", action="store_true",
                    help="under torchrun, each bf16 row again with the bf16_compress_hook")
    ap.add_argument("--json", help="append one JSON line per row to this file (rank 0)")
    args = ap.parse_args(argv)

    def pick(text, allowed, flag):
        items = [t for t in text.split(",") if t]
        if not items or "all" in items:
            return list(allowed)
        bad = [t for t in items if t not in allowed]
        if bad:
            ap.error(f"{flag}: {', '.join(bad)} not in {{{','.join(allowed)},all}}")
        return items

    args.models = pick(args.model, MODELS, "--model")
    args.precisions = pick(args.precision, PRECISIONS, "--precision")
    for flag in ("steps", "repeats", "batch"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag} must be at least 1")
    if args.warmup < 0 or args.eager_warmup < 11:
        ap.error("--warmup must be >= 0 and --eager-warmup >= 11 (DDP's capture needs 11 eager steps)")
    return args


def make_model(torch, name):
    nn = torch.nn
    if name == "mlp4096":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                             nn.Linear(4096, 10))
    return nn.Sequential(
        nn.Conv2d(1, 32, 5, padding=2, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def make_adam(torch, params, capturable):
    """Fused Adam (capturable for a graph), else the multi-tensor one; returns (optimizer, name)."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=1e-3, fused=True, capturable=capturable), "fused"
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=1e-3, capturable=capturable), "foreach"


def capture(torch, g, stream):
    """torch.cuda.graph on `stream`; thread_local, so the NCCL watchdog thread's event queries
    cannot invalidate the capture (the mode exists since torch 2.1)."""
    try:
        return torch.cuda.graph(g, stream=stream, capture_error_mode="thread_local")
    except TypeError:
        return torch.cuda.graph(g, stream=stream)


class Bench:
    def __init__(self, torch, args):
        self.torch, self.args = torch, args
        self.dist = torch.distributed
        self.launched = "WORLD_SIZE" in os.environ
        self.local = int(os.environ.get("LOCAL_RANK", "0"))
        self.dev = torch.device("cuda", self.local)
        torch.cuda.set_device(self.dev)
        if self.launched:
            try:
                self.dist.init_process_group("nccl", device_id=self.dev)
            except TypeError:  # torch < 2.3 has no device_id
                self.dist.init_process_group("nccl")
        self.rank = self.dist.get_rank() if self.launched else 0
        self.world = self.dist.get_world_size() if self.launched else 1
        torch.backends.cudnn.benchmark = True

    def reduce(self, value, op):
        if not self.launched:
            return value
        t = self.torch.tensor([value], dtype=self.torch.float64, device=self.dev)
        self.dist.all_reduce(t, op=op)
        return t.item()

    def weights_agree(self, net):
        if not self.launched:
            return True
        torch = self.torch
        with torch.no_grad():
            total = sum(p.double().sum() for p in net.parameters()).reshape(1)
        out = [torch.zeros_like(total) for _ in range(self.world)]
        self.dist.all_gather(out, total)
        return all(o.item() == out[0].item() for o in out)

    def build(self, model, amp, graph, side, grad_bf16):
        """Model (DDP when launched, made on the `side` stream), optimizer and the step function."""
        torch, args = self.torch, self.args
        torch.manual_seed(args.seed)
        net = make_model(torch, model).to(self.dev)
        ddp = net
        if self.launched:
            from torch.nn.parallel import DistributedDataParallel as DDP
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # as the CUDA-graph notes ask before a full-backward capture
                ddp = DDP(net, device_ids=[self.local], broadcast_buffers=False, gradient_as_bucket_view=True,
                          static_graph=True)
            torch.cuda.current_stream().wait_stream(side)
            if grad_bf16:
                from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
                ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
        opt, adam = make_adam(torch, net.parameters(), graph)

        def step(x, y):
            with torch.autocast("cuda", dtype=amp or torch.bfloat16, enabled=amp is not None, cache_enabled=False):
                loss = torch.nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            return loss

        return net, opt, step, adam

    def graph_step(self, model, amp, x, y, grad_bf16):
        """The step captured whole after eager DDP steps, all on one side stream (the one DDP was
        made on); returns (net, replay, adam)."""
        torch = self.torch
        side = torch.cuda.Stream()
        net, opt, step, adam = self.build(model, amp, True, side, grad_bf16)
        static_x, static_y = x.clone(), y.clone()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.args.eager_warmup):
                opt.zero_grad(set_to_none=True)
                step(static_x, static_y)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)  # backward makes the gradients inside the capture
        with capture(torch, g, side):
            loss = step(static_x, static_y)

        def replay():
            static_x.copy_(x)
            static_y.copy_(y)
            g.replay()
            return loss

        replay()
        torch.cuda.synchronize()
        return net, replay, adam

    def eager_step(self, model, amp, x, y, grad_bf16):
        net, opt, step, adam = self.build(model, amp, False, self.torch.cuda.Stream(), grad_bf16)

        def run():
            opt.zero_grad(set_to_none=True)
            return step(x, y)

        for _ in range(self.args.eager_warmup):
            run()
        return net, run, adam

    def row(self, model, precision, grad_bf16):
        torch, args = self.torch, self.args
        tf32 = precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
        amp = torch.bfloat16 if precision == "bf16" else None
        gen = torch.Generator(device=self.dev).manual_seed(args.seed + 1 + self.rank)  # each rank its own batch
        x = torch.randn(args.batch, 1, 28, 28, device=self.dev, generator=gen)
        y = torch.randint(0, 10, (args.batch,), device=self.dev, generator=gen)
        mode, note = args.mode, ""
        built = None
        if mode in ("auto", "graph"):
            failure = ""
            try:
                built = self.graph_step(model, amp, x, y, grad_bf16)
            except Exception as e:  # noqa: BLE001 -- any capture failure falls back, on every rank
                failure = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"
                built = None
            ok = self.reduce(0.0 if failure else 1.0, self.dist.ReduceOp.MIN)
            if ok < 1:
                if mode == "graph":
                    raise RuntimeError(f"graph capture failed: {failure or 'on another rank'}")
                note = f"graph capture failed ({failure or 'on another rank'}), eager steps"
                built, mode = None, "eager"
            else:
                mode = "graph"
        if built is None:
            built = self.eager_step(model, amp, x, y, grad_bf16)
        net, run, adam = built
        for _ in range(args.warmup):
            run()
        rates = []
        for _ in range(args.repeats):
            self.reduce(0.0, self.dist.ReduceOp.SUM)  # every rank here first
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                run()
            torch.cuda.synchronize()
            seconds = self.reduce(time.perf_counter() - t0, self.dist.ReduceOp.MAX)
            rates.append(self.world * args.batch * args.steps / seconds)
        rate = statistics.median(rates)
        loss = run().item()
        return {"bench": "torch", "model": model, "precision": precision, "world": self.world,
                "ddp": self.launched, "reducer": self.launched, "mode": mode, "batch_per_gpu": args.batch,
                "steps": args.steps, "repeats": args.repeats, "samples_per_s": rate, "ms_per_step": 1e3 * self.world * args.batch / rate,
                "windows": rates, "loss": loss if loss == loss and abs(loss) != float("inf") else None,
                "weights_agree": self.weights_agree(net), "grad_wire": "bf16" if grad_bf16 else "f32",
                "grad_view": True, "launch": "torchrun" if self.launched else "none",
                "device": torch.cuda.get_device_name(self.dev), "torch": torch.__version__, "adam": adam,
                "note": note}


def main(argv):
    args = parse_args(argv)
    if args.mode != "eager":  # before init_process_group, as the CUDA-graph notes ask
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
        os.environ.setdefault("NCCL_ASYNC_ERROR_HANDLING", "0")
    try:
        import torch
    except ImportError as e:
        print(f"bench_dist_torch: PyTorch is not installed ({e})")
        return 77
    if not torch.cuda.is_available():
        print("bench_dist_torch: no CUDA device, nothing to measure")
        return 77
    json_out = None
    if args.json and int(os.environ.get("RANK", "0")) == 0:
        try:
            json_out = open(args.json, "a")
        except OSError as e:
            print(f"bench_dist_torch: cannot write {args.json}: {e}", file=sys.stderr)
            return 2
    bench = Bench(torch, args)
    leader = bench.rank == 0
    if leader:
        nccl = torch.cuda.nccl.version()
        nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        how = f"NCCL {nccl}, torchrun" if bench.launched else "1 GPU, no DDP"
        print(f"bench_dist_torch on {torch.cuda.get_device_name(bench.dev)}: world {bench.world} ({how}), "
              f"torch {torch.__version__}, batch {args.batch} per GPU, {args.repeats} windows of {args.steps} steps"
              + (", gradients all-reduced in bf16" if args.grad_bf16 else ""), flush=True)
    try:
        for model in args.models:
            for precision, grad_bf16 in [(p, args.grad_bf16) for p in args.precisions] + (
                    [("bf16", True)] if args.bf16_grads_row and "bf16" in args.precisions and bench.launched
                    and not args.grad_bf16 else []):
                r = bench.row(model, precision, grad_bf16)
                if not leader:
                    continue
                print(f"{model:<8} {precision:<5} {r['world']} GPU{'s' if r['world'] > 1 else ' '} "
                      f"{r['launch'] if bench.launched else '(no DDP)':<9} {r['samples_per_s']:12.0f} samples/s "
                      f"{r['ms_per_step']:8.3f} ms/step  {r['mode']} ({r['adam']} Adam)"
                      + (" (bf16 on the wire)" if grad_bf16 else "") + f", loss {r['loss']}"
                      + ("" if r["weights_agree"] else "  WEIGHTS DIFFER BETWEEN RANKS")
                      + (f"  [{r['note']}]" if r["note"] else ""), flush=True)
                if json_out:
                    json_out.write(json.dumps(r) + "\n")
                    json_out.flush()
    finally:
        if bench.launched:
            bench.dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
