#!/usr/bin/env python3
"""Writes tests/fixtures/torch_state_dict.safetensors: the state dict of a tiny PyTorch model,
saved as PyTorch users save one, for kiln's test of loading PyTorch weights
(tests/engine/test_torch_state_dict.cpp):

    python3 tools/interop/make_torch_fixture.py tests/fixtures/torch_state_dict.safetensors

The model is nn.Sequential(Conv2d(1, 2, 3, bias=False), BatchNorm2d(2), ReLU(), Flatten(),
Linear(8, 3)); every value is fixed (arange-based, exact in binary), so the test can check them.
__metadata__ holds {"format": "pt"} (what safetensors.torch.save_model and transformers write),
the input, the model's output on it in eval mode and what wrote the file.

With torch: the model is built and run by PyTorch and saved by safetensors.torch.save_file.
Without torch (--numpy-fallback): the same tensors with numpy and the output computed by hand,
saved by safetensors.numpy.save_file; a provisional file with the same layout.
"""
import argparse
import json
import sys

IN_SHAPE = (1, 1, 4, 4)


def values():
    """Every tensor of the state dict by PyTorch's name: (flat values, shape, "f32" or "i64")."""
    return {
        "0.weight": ([(i - 9) / 16 for i in range(18)], (2, 1, 3, 3), "f32"),
        "1.weight": ([1.5, 0.75], (2,), "f32"),
        "1.bias": ([0.25, -0.5], (2,), "f32"),
        "1.running_mean": ([0.5, -1.0], (2,), "f32"),
        "1.running_var": ([4.0, 0.25], (2,), "f32"),
        "1.num_batches_tracked": ([7], (), "i64"),
        "4.weight": ([(i - 12) / 32 for i in range(24)], (3, 8), "f32"),
        "4.bias": ([0.125, -0.25, 0.5], (3,), "f32"),
    }


MODEL_INPUT = [i / 16 - 0.5 for i in range(16)]  # exact in f32, shape IN_SHAPE


def with_torch(out, torch):
    import safetensors
    from safetensors.torch import save_file

    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(1, 2, 3, bias=False), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(8, 3))
    dtypes = {"f32": torch.float32, "i64": torch.int64}
    state = {k: torch.tensor(v, dtype=dtypes[t]).reshape(shape) for k, (v, shape, t) in values().items()}
    model.load_state_dict(state, strict=True)
    model.eval()
    with torch.no_grad():
        y = model(torch.tensor(MODEL_INPUT, dtype=torch.float32).reshape(IN_SHAPE))
    writer = f"torch {torch.__version__}, safetensors {safetensors.__version__} (safetensors.torch.save_file)"
    save_file(model.state_dict(), out, metadata=metadata(y.flatten().tolist(), writer))


def with_numpy(out):
    import numpy as np
    import safetensors
    from safetensors.numpy import save_file

    dtypes = {"f32": np.float32, "i64": np.int64}
    v = {k: np.array(x, dtype=dtypes[t]).reshape(shape) for k, (x, shape, t) in values().items()}
    # The model in eval mode by hand, in f64: conv 3x3 (no padding), batch norm, ReLU, flatten, linear.
    x = np.array(MODEL_INPUT, dtype=np.float32).astype(np.float64).reshape(4, 4)
    w = v["0.weight"].astype(np.float64)
    conv = np.zeros((2, 2, 2))
    for c in range(2):
        for i in range(2):
            for j in range(2):
                conv[c, i, j] = (x[i:i + 3, j:j + 3] * w[c, 0]).sum()
    eps = 1e-5
    for c in range(2):
        conv[c] = (conv[c] - v["1.running_mean"][c]) / np.sqrt(v["1.running_var"][c] + eps) * v["1.weight"][c] + \
            v["1.bias"][c]
    h = np.maximum(conv, 0).reshape(8)
    y = v["4.weight"].astype(np.float64) @ h + v["4.bias"]
    writer = f"numpy {np.__version__}, safetensors {safetensors.__version__} (provisional: no torch)"
    save_file(v, out, metadata=metadata([float(t) for t in y], writer))


def metadata(output, writer):
    return {"format": "pt", "input": "(arange(16) / 16 - 0.5).reshape(1, 1, 4, 4)",
            "expected_output": json.dumps(output), "written_by": writer}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--numpy-fallback", action="store_true", help="write it with numpy when torch is missing")
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        if not args.numpy_fallback:
            print(f"make_torch_fixture: PyTorch is not installed ({e}); --numpy-fallback writes the same layout",
                  file=sys.stderr)
            return 1
        with_numpy(args.out)
    else:
        with_torch(args.out, torch)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
