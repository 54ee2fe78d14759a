#!/usr/bin/env python3
"""PyTorch on the CPU beside `mnist-train --device cpu`: the same network (bench_mnist_torch.py's
models), batch, Adam and one-cycle schedule, shuffled MNIST normalised as the trainer does, on
--threads threads (default: every core). Prints the training samples/s of --steps steps after
--warmup steps, as mnist-train's epoch line counts them (the step's loss read back each step):

    python3 tools/bench/mnist_cpu_torch.py --model cnn --steps 100
    mnist-train --model cnn --device cpu --epochs 1

Exits 77 without torch.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mnist_torch import MEAN, STD, load_mnist, models  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.environ.get("KILN_MNIST_DIR", "data/mnist"))
    ap.add_argument("--model", choices=["mlp", "cnn"], default="cnn")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--steps", type=int, default=100, help="timed steps (0: one epoch)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"mnist_cpu_torch: PyTorch is not installed ({e})")
        return 77
    torch.set_num_threads(args.threads)
    data = load_mnist(args.data, torch)
    if data is None:
        print(f"mnist_cpu_torch: MNIST is not in {args.data}")
        return 1
    images = (data[0].float().div(255).sub(MEAN).div(STD)).unsqueeze(1)
    labels = data[1].long()
    torch.manual_seed(0)
    net = models(torch)[args.model]()
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    batches = len(images) // args.batch_size
    steps = args.steps or batches
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.warmup + steps)
    order = torch.randperm(len(images))
    net.train()

    def step(i):
        idx = order[(i % batches) * args.batch_size:(i % batches + 1) * args.batch_size]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(images[idx]), labels[idx])
        loss.backward()
        opt.step()
        sched.step()
        return loss.item()

    for i in range(args.warmup):
        step(i)
    t0 = time.perf_counter()
    for i in range(args.warmup, args.warmup + steps):
        loss = step(i)
    s = time.perf_counter() - t0
    print(f"torch {torch.__version__} {args.model} cpu, {args.threads} threads, batch {args.batch_size}: "
          f"{steps * args.batch_size / s:.0f} samples/s over {steps} steps (last loss {loss:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
