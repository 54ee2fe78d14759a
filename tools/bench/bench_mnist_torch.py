#!/usr/bin/env python3
"""PyTorch twin of bench_mnist (examples/mnist/bench/bench_mnist.cpp): the same models, optimizer,
schedules, batch sizes and measurements in PyTorch eager on the same GPU. Beside each eager
step row: graph_* (the step captured with torch.cuda.graph and capturable Adam, set against
kiln's compiled step of the same name), inductor_* (torch.compile(mode="reduce-overhead")) and,
for the mlp, autotune_* (torch.compile(mode="max-autotune")); the torch.compile rows stand
beside kiln's compiled step, and fail with value -1 and the reason in the note. With --kiln
FILE (bench_mnist's output) it prints both and the ratio torch/kiln per row, then kiln's
fused_* rows (its compiled steps with fusion on):

    build/tools/bench_mnist > kiln.txt
    python3 tools/bench/bench_mnist_torch.py --kiln kiln.txt

--precision f32|tf32|bf16|f16 measures every row as bench_mnist --precision does: f32 with
torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32 off, tf32 with both
on, bf16/f16 with forward and loss under torch.autocast (TF32 off; f16 with a GradScaler).
Without it, PyTorch's defaults (TF32 for cuDNN convolutions only, as kiln's defaults).

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


def mnist_on_device(data, dev):
    """load_mnist's tensors on dev: images normalised as mnist-train does, (N, 1, 28, 28); labels i64."""
    xtr, ytr, xte, yte = data
    xtr = ((xtr.to(dev).float() / 255 - MEAN) / STD).unsqueeze(1)
    xte = ((xte.to(dev).float() / 255 - MEAN) / STD).unsqueeze(1)
    return xtr, ytr.to(dev).long(), xte, yte.to(dev).long()


def schedule(torch, opt, cnn, lr, total_steps):
    """mnist-train's default schedule: onecycle for the cnn, cosine for the mlp."""
    if cnn:
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=total_steps)
    return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total_steps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.environ.get("KILN_MNIST_DIR", "data/mnist"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kiln", help="bench_mnist output to compare with")
    ap.add_argument("--only", choices=["mlp", "cnn"], help="one model's rows")
    ap.add_argument("--no-tta", action="store_true", help="skip the time-to-accuracy rows")
    ap.add_argument("--no-autotune", action="store_true", help="skip torch.compile(mode='max-autotune')")
    ap.add_argument("--graph-only", action="store_true",
                    help="of the compiled rows, only the CUDA graph (no torch.compile, which takes minutes to build)")
    ap.add_argument("--precision", choices=["f32", "tf32", "bf16", "f16"], help="as bench_mnist --precision")
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
    if args.precision:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    amp_dtype = {"bf16": torch.bfloat16, "f16": torch.float16}.get(args.precision)

    def autocast():
        return torch.autocast("cuda", dtype=amp_dtype, enabled=amp_dtype is not None)

    def scaler():
        enabled = amp_dtype == torch.float16
        if hasattr(torch.amp, "GradScaler"):  # torch >= 2.3
            return torch.amp.GradScaler("cuda", enabled=enabled)
        return torch.cuda.amp.GradScaler(enabled=enabled)

    def loss_of(net, x, y):
        with autocast():
            return torch.nn.functional.cross_entropy(net(x), y)

    def setup(model, batch, **adam):
        torch.manual_seed(args.seed)
        net = make[model]().to(dev)
        opt = torch.optim.Adam(net.parameters(), lr=1e-3, **adam)
        x = torch.randn(batch, 1, 28, 28, device=dev)
        y = torch.randint(0, 10, (batch,), device=dev)
        return net, opt, x, y

    def median_ms(step, warmup=20):
        for _ in range(warmup):
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

    def step_ms(model, batch):
        net, opt, x, y = setup(model, batch)
        sc = scaler()

        def step():
            sc.scale(loss_of(net, x, y)).backward()
            sc.step(opt)
            sc.update()
            opt.zero_grad()

        return median_ms(step)

    # The step captured whole with torch.cuda.graph as the PyTorch docs show ("Whole-network
    # capture"): capturable Adam, warm-up on a side stream, grads set to None before capture so
    # backward allocates them from the graph's pool; each replay copies the batch in, as kiln's
    # compiled call does. Under f16 the Adam is fused, the kind GradScaler steps without a host read.
    def graph_step_ms(model, batch):
        adam = {"fused": True} if amp_dtype == torch.float16 else {"capturable": True}
        net, opt, x, y = setup(model, batch, **adam)
        static_x, static_y = x.clone(), y.clone()
        sc = scaler()

        def scaled_step():
            sc.scale(loss_of(net, static_x, static_y)).backward()
            sc.step(opt)
            sc.update()

        def eager_step():
            opt.zero_grad(set_to_none=True)
            scaled_step()

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                eager_step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            scaled_step()

        def replay():
            static_x.copy_(x)
            static_y.copy_(y)
            g.replay()

        return median_ms(replay)

    # torch.compile of the whole step: "reduce-overhead" replays Inductor kernels as CUDA graphs
    # (backward is a graph break; each piece is captured on its own); "max-autotune" also tunes
    # Triton GEMMs for the shapes, which takes minutes, so it runs for the mlp only.
    def compile_step_ms(model, batch, mode="reduce-overhead"):
        torch._dynamo.reset()
        net, opt, x, y = setup(model, batch)
        sc = scaler()

        @torch.compile(mode=mode)
        def step(x, y):
            sc.scale(loss_of(net, x, y)).backward()
            sc.step(opt)
            sc.update()
            opt.zero_grad()

        return median_ms(lambda: step(x, y))

    def autotune_step_ms(model, batch):
        return compile_step_ms(model, batch, "max-autotune")

    def step_rows(model, batch):
        tag = f"{model}_b{batch}"
        eager = step_ms(model, batch)
        rows.append({"name": f"step_{tag}", "value": eager, "unit": "ms", "note": ""})
        modes = [("graph", graph_step_ms, "graph")]
        if not args.graph_only:
            modes.append(("inductor", compile_step_ms, "compiled"))
        if model == "mlp" and not args.no_autotune and not args.graph_only:
            modes.append(("autotune", autotune_step_ms, "max-autotune"))
        for name, fn, what in modes:
            try:
                ms = fn(model, batch)
                note = f"eager/{what} {eager / ms:.2f}x"
            except Exception as e:  # report why in the row, measure the rest
                ms, note = -1.0, f"failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}"
            rows.append({"name": f"{name}_{tag}", "value": ms, "unit": "ms", "note": note})

    def time_to_accuracy(model, target, data):
        cnn = model == "cnn"
        epochs, lr = (5, 2e-3) if cnn else (10, 1e-3)
        torch.manual_seed(args.seed)
        net = make[model]().to(dev)
        opt = torch.optim.Adam(net.parameters(), lr=lr)
        sc = scaler()
        xtr, ytr, xte, yte = mnist_on_device(data, dev)
        n, batches = xtr.shape[0], (xtr.shape[0] + 127) // 128
        total, quarter = batches * epochs, batches // 4
        sched = schedule(torch, opt, cnn, lr, total)
        gen = torch.Generator(device=dev).manual_seed(args.seed)

        def accuracy():
            net.eval()
            with torch.no_grad(), autocast():
                correct = sum((net(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum() for i in range(0, 10000, 1000))
            net.train()
            return correct.item() / 10000

        trained = 0.0
        for e in range(epochs):
            perm = torch.randperm(n, device=dev, generator=gen)
            t0 = time.perf_counter()
            for i in range(batches):
                idx = perm[i * 128:(i + 1) * 128]
                loss = loss_of(net, xtr[idx], ytr[idx])
                sc.scale(loss).backward()
                sc.step(opt)
                sc.update()
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

    for model, batch in (("mlp", 128), ("mlp", 1024), ("cnn", 128)):
        if args.only in (None, model):
            step_rows(model, batch)
    data = None if args.no_tta else load_mnist(args.data, torch)
    if data is not None:
        for model, target in (("mlp", 0.98), ("cnn", 0.99)):
            if args.only not in (None, model):
                continue
            s, note = time_to_accuracy(model, target, data)
            rows.append({"name": f"tta_{model}_{int(target * 100)}", "value": s, "unit": "s", "note": note})

    kiln = {}
    if args.kiln:
        with open(args.kiln) as f:
            for line in f:
                if line.startswith("{"):
                    kiln = {r["name"]: r for r in json.loads(line)["rows"]}
    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name(0)}"
          + (f", precision {args.precision}" if args.precision else ""))
    print(f"{'row':<18} {'kiln':>10} {'pytorch':>10} {'unit':<4} {'torch/kiln':>10}  notes")
    for r in rows:
        # torch.compile's rows stand beside kiln's compiled step of the same shape.
        k = kiln.get(r["name"]) or kiln.get("graph_" + r["name"].split("_", 1)[1])
        kv = k["value"] if k else None
        ratio = r["value"] / kv if kv and kv > 0 and r["value"] > 0 else None
        print(f"{r['name']:<18} {kv if kv is not None else float('nan'):>10.4f} {r['value']:>10.4f} {r['unit']:<4} "
              f"{ratio if ratio else float('nan'):>10.2f}  kiln: {k['note'] if k else ''}; torch: {r['note']}")
    for name, k in kiln.items():  # kiln's own rows (fused steps)
        if not any(r["name"] == name for r in rows):
            print(f"{name:<18} {k['value']:>10.4f} {float('nan'):>10.4f} {k['unit']:<4} {float('nan'):>10.2f}  kiln: {k['note']}")
    extra = {"precision": args.precision} if args.precision else {}
    print(json.dumps({"bench": "torch", **extra, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
