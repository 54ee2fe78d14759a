#!/usr/bin/env bash
# kiln's MNIST trainer on the CPU beside PyTorch on the CPU, one after the other in one call:
# the mlp and the cnn with the trainer's recipe on the first 12,800 training images (100 steps
# of 128), on the same number of threads. kiln's figure is its last epoch's samples/s (the
# first warms up), PyTorch's that of 100 steps after 5 warm-up steps (mnist_cpu_torch.py).
#   tools/bench/mnist_cpu.sh [build dir]    MNIST from $KILN_MNIST_DIR (default data/mnist)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
data=${KILN_MNIST_DIR:-data/mnist}
threads=${KILN_CPU_THREADS:-$(nproc)}
train="$build/examples/mnist/mnist-train"
[ -x "$train" ] || { echo "mnist_cpu.sh: no $train (cmake --build $build --target mnist-train)" >&2; exit 1; }
subset=$(mktemp -d)
trap 'rm -rf "$subset"' EXIT
python3 - "$data" "$subset" 12800 <<'PY'
import gzip, os, shutil, struct, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def read(stem):
    for name in (stem, stem + ".gz"):
        path = os.path.join(src, name)
        if os.path.exists(path):
            return (gzip.open if name.endswith(".gz") else open)(path, "rb").read()
    sys.exit(f"mnist_cpu.sh: {stem} is not in {src}")
for stem, keep in (("train-images-idx3-ubyte", n), ("train-labels-idx1-ubyte", n),
                   ("t10k-images-idx3-ubyte", None), ("t10k-labels-idx1-ubyte", None)):
    raw = read(stem)
    dims = raw[3]
    shape = list(struct.unpack(f">{dims}I", raw[4:4 + 4 * dims]))
    per_item = 1
    for d in shape[1:]:
        per_item *= d
    count = shape[0] if keep is None else min(keep, shape[0])
    head = raw[:4] + struct.pack(f">{dims}I", count, *shape[1:])
    body = raw[4 + 4 * dims:4 + 4 * dims + count * per_item]
    open(os.path.join(dst, stem), "wb").write(head + body)
PY
echo "$(nproc) hardware threads, $threads used; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
for model in mlp cnn; do
  epochs=2; [ "$model" = mlp ] && epochs=3
  line=$(KILN_CPU_THREADS=$threads "$train" --device cpu --model "$model" --epochs "$epochs" --data "$subset" |
         grep -E '^epoch' | tail -1)
  echo "kiln $model cpu, $threads threads, batch 128: $(grep -oE '[0-9]+ samples/s' <<<"$line") (last of $epochs epochs)"
  python3 tools/bench/mnist_cpu_torch.py --data "$subset" --model "$model" --steps 100 --threads "$threads" ||
    [ $? -eq 77 ]
done
