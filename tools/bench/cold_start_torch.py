#!/usr/bin/env python3
"""PyTorch eager beside `mnist-train --model cnn` (or mlp) from a cold start: one process, timed
from its first line (before `import torch`) to the end of the epoch whose test accuracy first
reaches the target, with mnist-train's recipe (Adam, onecycle for the cnn and cosine for the mlp,
batch 128, evaluation after each epoch). Prints the whole-process seconds to the target, the
training seconds to it (evaluation excluded, as mnist-train's summary) and the whole run's.

    python3 tools/bench/cold_start_torch.py --model cnn --precision bf16

--precision as mnist-train's: f32 (TF32 off), tf32, bf16 (autocast). Exits 77 without torch or
a CUDA device.
"""
import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mnist_torch import load_mnist, mnist_on_device, models, schedule  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["mlp", "cnn"], default="cnn")
    ap.add_argument("--precision", choices=["f32", "tf32", "bf16"], default="f32")
    ap.add_argument("--data", default=os.environ.get("KILN_MNIST_DIR", "data/mnist"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"cold_start_torch: PyTorch is not installed ({e})")
        return 77
    if not torch.cuda.is_available():
        print("cold_start_torch: no CUDA device, nothing to measure")
        return 77
    dev = torch.device("cuda", 0)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    amp = torch.bfloat16 if args.precision == "bf16" else None
    cnn = args.model == "cnn"
    epochs, lr, target = (5, 2e-3, 0.99) if cnn else (10, 1e-3, 0.98)
    data = load_mnist(args.data, torch)
    if data is None:
        print(f"cold_start_torch: no MNIST files in {args.data}")
        return 1
    torch.manual_seed(args.seed)
    net = models(torch)[args.model]().to(dev)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    xtr, ytr, xte, yte = mnist_on_device(data, dev)
    n, batches = xtr.shape[0], (xtr.shape[0] + 127) // 128
    sched = schedule(torch, opt, cnn, lr, batches * epochs)
    gen = torch.Generator(device=dev).manual_seed(args.seed)

    def autocast():
        return torch.autocast("cuda", dtype=amp, enabled=amp is not None)

    def accuracy():
        net.eval()
        with torch.no_grad(), autocast():
            correct = sum((net(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum() for i in range(0, 10000, 1000))
        net.train()
        return correct.item() / 10000

    trained, process_at, train_at = 0.0, None, None
    for e in range(epochs):
        perm = torch.randperm(n, device=dev, generator=gen)
        t0 = time.perf_counter()
        for i in range(batches):
            idx = perm[i * 128:(i + 1) * 128]
            with autocast():
                loss = torch.nn.functional.cross_entropy(net(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            opt.zero_grad()
            sched.step()
        loss.item()
        trained += time.perf_counter() - t0
        acc = accuracy()
        print(f"epoch {e + 1}: test accuracy {100 * acc:.2f}%, {trained:.2f} s training")
        if acc >= target and process_at is None:
            process_at, train_at = time.perf_counter() - T0, trained
    whole = time.perf_counter() - T0
    reached = f"{process_at:.2f} s after the start ({train_at:.2f} s training)" if process_at else "not reached"
    print(f"PyTorch {torch.__version__} eager, {args.model} {args.precision}: {int(target * 100)}% {reached}; "
          f"whole process {whole:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
