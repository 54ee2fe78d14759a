#!/usr/bin/env python3
"""Loads a checkpoint written by `mnist-train --save` into the equivalent PyTorch model and
evaluates it on the MNIST test set, to show the file is readable by other tools and holds
the trained network (its accuracy should equal `mnist-train --eval-only --load` on it):

    python3 tools/interop/torch_eval.py model.safetensors --model mlp --data data/mnist

Reads the file with the `safetensors` package when installed, else with the format's
definition (8-byte little-endian header length, JSON header, raw little-endian data).
Exits 77 without torch.
"""
import argparse
import json
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
from bench_mnist_torch import MEAN, STD, load_mnist, models  # noqa: E402


def read_safetensors(path, torch):
    try:
        from safetensors.torch import load_file
        return load_file(path), "safetensors " + __import__("safetensors").__version__
    except ImportError:
        pass
    dtypes = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8, "BOOL": torch.bool}
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        buf = bytearray(raw[8 + n + b:8 + n + end])
        out[name] = torch.frombuffer(buf, dtype=dtypes[e["dtype"]]).reshape(e["shape"]) if buf else \
            torch.zeros(e["shape"], dtype=dtypes[e["dtype"]])
    return out, "the format's definition (no safetensors package)"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    ap.add_argument("--data", default=os.environ.get("KILN_MNIST_DIR", "data/mnist"))
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"torch_eval: PyTorch is not installed ({e})")
        return 77
    tensors, reader = read_safetensors(args.checkpoint, torch)
    state = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    net = models(torch)[args.model]()
    net.load_state_dict(state, strict=True)
    net.eval()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    net.to(dev)
    _, _, xte, yte = load_mnist(args.data, torch)
    x = ((xte.to(dev).float() / 255 - MEAN) / STD).unsqueeze(1)
    with torch.no_grad():
        correct = sum((net(x[i:i + 1000]).argmax(1) == yte[i:i + 1000].to(dev)).sum().item() for i in range(0, 10000, 1000))
    print(f"read with {reader}: {len(tensors)} tensors; PyTorch {torch.__version__} test accuracy {100 * correct / 10000:.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
