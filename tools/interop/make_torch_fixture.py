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


def values(np):
    """Every tensor of the state dict, by PyTorch's name, as numpy arrays."""
    f32 = np.float32
    return {
        "0.weight": ((np.arange(18) - 9) / 16).astype(f32).reshape(2, 1, 3, 3),
        "1.weight": np.array([1.5, 0.75], f32),
        "1.bias": np.array([0.25, -0.5], f32),
        "1.running_mean": np.array([0.5, -1.0], f32),
        "1.running_var": np.array([4.0, 0.25], f32),
        "1.num_batches_tracked": np.array(7, np.int64),
        "4.weight": ((np.arange(24) - 12) / 32).astype(f32).reshape(3, 8),
        "4.bias": np.array([0.125, -0.25, 0.5], f32),
    }


def model_input(np):
    return (np.arange(16) / 16 - 0.5).astype(np.float32).reshape(IN_SHAPE)


def with_torch(out, torch):
    import numpy as np
    from safetensors.torch import save_file

    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(1, 2, 3, bias=False), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(8, 3))
    model.load_state_dict({k: torch.from_numpy(v) for k, v in values(np).items()}, strict=True)
    model.eval()
    with torch.no_grad():
        y = model(torch.from_numpy(model_input(np)))
    import safetensors
    writer = f"torch {torch.__version__}, safetensors {safetensors.__version__} (safetensors.torch.save_file)"
    save_file(model.state_dict(), out, metadata=metadata(y.flatten().tolist(), writer))


def with_numpy(out):
    import numpy as np
    import safetensors
    from safetensors.numpy import save_file

    v = values(np)
    x = model_input(np)[0, 0].astype(np.float64)
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
