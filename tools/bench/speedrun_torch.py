#!/usr/bin/env python3
"""PyTorch twin of `mnist-train --recipe speedrun` (examples/mnist/speedrun.{h,cpp}): the same
network, batch, optimizer, schedule, precision and timing on the same data and GPU, in four
modes: eager; graph (the whole step captured with torch.cuda.graph, as the PyTorch docs show);
compile (the network through torch.compile: Inductor's fused kernels, forward and backward,
the fused Adam outside); compile+graph (that compiled step captured whole with
torch.cuda.graph, usually PyTorch's fastest). Each mode runs the same seeds; a run's
training time goes from its first step to the end of its last (the shuffle included, data already
on the GPU, warm-up, compilation and capture printed apart), its evaluation is timed apart too.

With --kiln FILE (the JSON lines of `mnist-train --recipe speedrun --seeds N --metrics FILE`,
run on the same GPU just before) it prints kiln beside each mode and the ratio of PyTorch's best
training time to kiln's:

    build/examples/mnist/mnist-train --recipe speedrun --seeds 10 --metrics kiln.jsonl
    python3 tools/bench/speedrun_torch.py --seeds 10 --kiln kiln.jsonl

Exits 77 without torch or a CUDA device.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mnist_torch import load_mnist  # noqa: E402  (the same IDX reader)

MEAN, STD = 0.1307, 0.3081
# The recipe, as examples/mnist/speedrun.h has it.
CONV1, CONV2, HIDDEN = 24, 32, 256
BATCH, EPOCHS = 256, 1.0
LR, BETAS = 0.01, (0.7, 0.9)
LABEL_SMOOTHING = 0.1


def network(torch):
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(1, CONV1, 5, bias=False), nn.BatchNorm2d(CONV1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(CONV1, CONV2, 3, bias=False), nn.BatchNorm2d(CONV2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(CONV2 * 25, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 10))


def one_cycle_lrs(torch, steps):
    """torch's OneCycleLR (cosine, pct_start 0.3, div 25, final div 1e4) without momentum cycling,
    as kiln's optim::OneCycleLR: the lr of each step."""
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=LR)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, LR, total_steps=steps, cycle_momentum=False)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


class Runner:
    """One mode's model, optimizer and step. The step reads its batch and lr on the device from a
    step counter, so eager, graph and compile do the same work and the host only calls it."""

    def __init__(self, torch, mode, X, Y, steps):
        self.torch, self.mode, self.X, self.Y, self.steps = torch, mode, X, Y, steps
        dev = X.device
        self.net = network(torch).to(dev)
        self.lrs = torch.tensor(one_cycle_lrs(torch, steps), dtype=torch.float32, device=dev)
        self.lr = torch.tensor(LR, dtype=torch.float32, device=dev)
        self.counter = torch.zeros(1, dtype=torch.long, device=dev)
        self.perm = torch.zeros(steps * BATCH, dtype=torch.long, device=dev)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=self.lr, betas=BETAS, fused=True,
                                    capturable=mode in ("graph", "compile+graph"))
        self.graph = None
        self.captures = mode in ("graph", "compile+graph")
        # Inductor's kernels, compiled at the first call (warm-up); capturable like any others.
        self.forward = torch.compile(self.net) if mode.startswith("compile") else self.net

    def body(self):
        torch, F = self.torch, self.torch.nn.functional
        idx = self.perm.view(self.steps, BATCH).index_select(0, self.counter).view(-1)
        self.lr.copy_(self.lrs.index_select(0, self.counter).view([]))
        self.counter.add_(1)
        with torch.autocast("cuda", torch.bfloat16):
            loss = F.cross_entropy(self.forward(self.X.index_select(0, idx)), self.Y.index_select(0, idx),
                                   label_smoothing=LABEL_SMOOTHING)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def reset(self, seed):
        """Weights of `seed`, zeroed optimizer state and step counter, in place."""
        torch = self.torch
        torch.manual_seed(seed)
        fresh = network(torch).to(self.X.device)
        with torch.no_grad():
            self.net.load_state_dict(fresh.state_dict())
            for state in self.opt.state.values():
                for v in state.values():
                    if torch.is_tensor(v):
                        v.zero_()
            self.counter.zero_()
        self.net.train()

    def step(self):
        if self.graph is not None:
            self.graph.replay()
        else:
            self.opt.zero_grad(set_to_none=True)
            self.body()

    def warm_up(self):
        """Kernels chosen and loaded, the graph captured or the step compiled, on real batches."""
        torch = self.torch
        self.perm.copy_(torch.randperm(self.X.size(0), device=self.X.device)[: self.perm.numel()])
        if self.captures and self.graph is None:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    self.opt.zero_grad(set_to_none=True)
                    self.body()
            torch.cuda.current_stream().wait_stream(s)
            self.opt.zero_grad(set_to_none=True)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.body()
        for _ in range(3):
            self.step()

    def train(self, seed):
        torch = self.torch
        gen = torch.Generator(device=self.X.device)
        gen.manual_seed(seed)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        self.perm.copy_(torch.randperm(self.X.size(0), device=self.X.device, generator=gen)[: self.perm.numel()])
        for _ in range(self.steps):
            self.step()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def evaluate(self, Xte, Yte):
        torch = self.torch
        self.net.eval()
        with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
            logits = self.net(Xte).float()
            loss = torch.nn.functional.cross_entropy(logits, Yte).item()
            acc = (logits.argmax(1) == Yte).float().mean().item()
        self.net.train()
        return acc, loss


def summary(rows):
    acc = [r["test_accuracy"] for r in rows]
    secs = [r["train_seconds"] for r in rows]
    return {"n": len(rows), "mean": statistics.mean(acc), "min": min(acc), "max": max(acc),
            "median_s": statistics.median(secs), "mean_s": statistics.mean(secs),
            "capture_s": statistics.median(r["capture_seconds"] for r in rows),
            "eval_s": statistics.median(r["eval_seconds"] for r in rows)}


def print_table(sides):
    print(f"{'side':<22}{'runs':>5}{'acc mean':>10}{'min':>8}{'max':>8}{'train s med':>13}{'mean':>9}"
          f"{'warm-up s':>11}{'eval s':>9}")
    for name, s in sides:
        print(f"{name:<22}{s['n']:>5}{100 * s['mean']:>9.3f}%{100 * s['min']:>7.2f}%{100 * s['max']:>7.2f}%"
              f"{s['median_s']:>13.4f}{s['mean_s']:>9.4f}{s['capture_s']:>11.3f}{s['eval_s']:>9.4f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.environ.get("KILN_MNIST_DIR", "data/mnist"))
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--modes", default="eager,graph,compile,compile+graph",
                    help="comma-separated: eager, graph, compile, compile+graph")
    ap.add_argument("--kiln", help="JSON lines of mnist-train --recipe speedrun --metrics")
    ap.add_argument("--json", help="write every run of every mode here, one JSON object per line")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("speedrun_torch: torch is not installed", file=sys.stderr)
        return 77
    if not torch.cuda.is_available():
        print("speedrun_torch: no CUDA device", file=sys.stderr)
        return 77
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in ("eager", "graph", "compile", "compile+graph")]
    if bad:
        ap.error(f"--modes: unknown mode(s) {bad}; choose from eager, graph, compile, compile+graph")
    data = load_mnist(args.data, torch)
    if data is None:
        print(f"speedrun_torch: the four MNIST files are not in {args.data}", file=sys.stderr)
        return 1
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False  # bf16 autocast does the matmuls and convs
    dev = torch.device("cuda")
    X = ((data[0].to(dev).float() / 255 - MEAN) / STD).unsqueeze(1).contiguous()
    Y = data[1].to(dev).long()
    Xte = ((data[2].to(dev).float() / 255 - MEAN) / STD).unsqueeze(1).contiguous()
    Yte = data[3].to(dev).long()
    steps = max(1, round(EPOCHS * (X.size(0) // BATCH)))
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}: recipe speedrun, {steps} steps of {BATCH}, "
          f"seeds {args.seed}..{args.seed + args.seeds - 1}")

    sides, out = [], []
    if args.kiln:
        with open(args.kiln) as f:
            kiln_rows = [json.loads(line) for line in f if line.strip()]
        sides.append(("kiln " + ("compiled" if kiln_rows[0].get("compiled") else "eager"), summary(kiln_rows)))
    for mode in modes:
        runner, rows = None, []
        for seed in range(args.seed, args.seed + args.seeds):
            t0 = time.perf_counter()
            try:
                if runner is None:
                    runner = Runner(torch, mode, X, Y, steps)
                runner.reset(seed)
                runner.warm_up()
                runner.evaluate(Xte, Yte)
                runner.reset(seed)
                torch.cuda.synchronize()
            except Exception as e:  # torch.compile can fail where its toolchain is missing
                print(f"{mode}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
                rows = []
                break
            capture = time.perf_counter() - t0
            train_s = runner.train(seed)
            t0 = time.perf_counter()
            acc, loss = runner.evaluate(Xte, Yte)
            row = {"mode": mode, "seed": seed, "test_accuracy": acc, "test_loss": loss, "train_seconds": train_s,
                   "capture_seconds": capture, "eval_seconds": time.perf_counter() - t0, "steps": steps}
            rows.append(row)
            print(f"torch {mode} seed {seed}: test accuracy {100 * acc:.2f}%, training {train_s:.4f} s, "
                  f"warm-up {capture:.3f} s", flush=True)
        if rows:
            sides.append((f"torch {mode}", summary(rows)))
            out += rows
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in out)
    print()
    print_table(sides)
    torch_sides = [(n, s) for n, s in sides if n.startswith("torch")]
    if args.kiln and torch_sides:
        best_name, best = min(torch_sides, key=lambda ns: ns[1]["median_s"])
        kiln = sides[0][1]
        print(f"\nPyTorch's best mode: {best_name} at {best['median_s']:.4f} s; kiln {kiln['median_s']:.4f} s: "
              f"kiln is {best['median_s'] / kiln['median_s']:.2f}x its speed (median training time)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
