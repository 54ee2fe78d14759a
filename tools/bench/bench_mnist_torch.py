#!/usr/bin/env python3
"""PyTorch twin of bench_mnist (tools/bench/bench_mnist.cpp): the same models, optimizer,
schedules, batch sizes and measurements in PyTorch eager on the same GPU. With --kiln FILE
(bench_mnist's output) it prints both and the ratio kiln/PyTorch per row:

    build/tools/bench_mnist > kiln.txt
    python3 tools/bench/bench_mnist_torch.py --kiln kiln.txt

Exits 77 without torch or a CUDA device.
"""
import argparse
import gzip
import json
import os
import statistics
import sys
import time

MEAN, STD = 0.1307, 0.3081


def models(torch):
    nn = torch.nn

    def mlp():
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                             nn.Linear(512, 10))

    def cnn():
        return nn.Sequential(
            nn.Conv2d(1, 32, 5, padding=2, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))

    return {"mlp": mlp, "cnn": cnn}


def read_idx(path, torch):
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return torch.frombuffer(bytearray(raw[4 + 4 * ndim:]), dtype=torch.uint8).reshape(dims)


def load_mnist(d, torch):
    def find(stem):
        for name in (stem, stem + ".gz"):
            if os.path.exists(os.path.join(d, name)):
                return os.path.join(d, name)
        return None

    names = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
    paths = [find(n) for n in names]
    if None in paths:
        return None
    return [read_idx(p, torch) for p in paths]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.environ.get("KILN_MNIST_DIR", "data/mnist"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kiln", help="bench_mnist output to compare with")
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"bench_mnist_torch: PyTorch is not installed ({e})")
        return 77
    if not torch.cuda.is_available():
        print("bench_mnist_torch: no CUDA device, nothing to measure")
        return 77
    dev = torch.device("cuda", 0)
    make = models(torch)
    rows = []

    def step_ms(model, batch):
        torch.manual_seed(args.seed)
        net = make[model]().to(dev)
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        x = torch.randn(batch, 1, 28, 28, device=dev)
        y = torch.randint(0, 10, (batch,), device=dev)

        def step():
            loss = torch.nn.functional.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()

        for _ in range(20):
            step()
        ms = []
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
            ms.append((time.perf_counter() - t0) * 1e3 / args.steps)
        return statistics.median(ms)

    def time_to_accuracy(model, target, data):
        cnn = model == "cnn"
        epochs, lr = (5, 2e-3) if cnn else (10, 1e-3)
        torch.manual_seed(args.seed)
        net = make[model]().to(dev)
        opt = torch.optim.Adam(net.parameters(), lr=lr)
        xtr, ytr, xte, yte = data
        xtr = ((xtr.to(dev).float() / 255 - MEAN) / STD).unsqueeze(1)
        xte = ((xte.to(dev).float() / 255 - MEAN) / STD).unsqueeze(1)
        ytr, yte = ytr.to(dev).long(), yte.to(dev).long()
        n, batches = xtr.shape[0], (xtr.shape[0] + 127) // 128
        total, quarter = batches * epochs, batches // 4
        if cnn:
            sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=total)
        else:
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
        gen = torch.Generator(device=dev).manual_seed(args.seed)

        def accuracy():
            net.eval()
            with torch.no_grad():
                correct = sum((net(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum() for i in range(0, 10000, 1000))
            net.train()
            return correct.item() / 10000

        trained = 0.0
        for e in range(epochs):
            perm = torch.randperm(n, device=dev, generator=gen)
            t0 = time.perf_counter()
            for i in range(batches):
                idx = perm[i * 128:(i + 1) * 128]
                loss = torch.nn.functional.cross_entropy(net(xtr[idx]), ytr[idx])
                loss.backward()
                opt.step()
                opt.zero_grad()
                sched.step()
                if (i + 1) % quarter == 0 or i + 1 == batches:
                    loss.item()
                    trained += time.perf_counter() - t0
                    acc = accuracy()
                    if acc >= target:
                        return trained, f"epoch {e + (i + 1) / batches:.2f}, accuracy {100 * acc:.2f}%"
                    t0 = time.perf_counter()
        return -1.0, "not reached"

    rows.append({"name": "step_mlp_b128", "value": step_ms("mlp", 128), "unit": "ms", "note": ""})
    rows.append({"name": "step_mlp_b1024", "value": step_ms("mlp", 1024), "unit": "ms", "note": ""})
    rows.append({"name": "step_cnn_b128", "value": step_ms("cnn", 128), "unit": "ms", "note": ""})
    data = load_mnist(args.data, torch)
    if data is not None:
        for model, target in (("mlp", 0.98), ("cnn", 0.99)):
            s, note = time_to_accuracy(model, target, data)
            rows.append({"name": f"tta_{model}_{int(target * 100)}", "value": s, "unit": "s", "note": note})

    kiln = {}
    if args.kiln:
        with open(args.kiln) as f:
            for line in f:
                if line.startswith("{"):
                    kiln = {r["name"]: r for r in json.loads(line)["rows"]}
    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    print(f"{'row':<16} {'kiln':>10} {'pytorch':>10} {'unit':<4} {'torch/kiln':>10}  notes")
    for r in rows:
        k = kiln.get(r["name"])
        kv = k["value"] if k else None
        ratio = r["value"] / kv if kv and kv > 0 and r["value"] > 0 else None
        print(f"{r['name']:<16} {kv if kv is not None else float('nan'):>10.4f} {r['value']:>10.4f} {r['unit']:<4} "
              f"{ratio if ratio else float('nan'):>10.2f}  kiln: {k['note'] if k else ''}; torch: {r['note']}")
    print(json.dumps({"bench": "torch", "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
