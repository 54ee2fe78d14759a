#!/usr/bin/env bash
# The op differential test against PyTorch: kiln_difftest runs every registry op's cases on
# DEVICE and writes them to OUTDIR, then torch_difftest.py replays them in PyTorch on the
# same device and compares values and gradients. Exits non-zero on any unexplained failure.
#
#   tools/difftest/run.sh cpu|cuda OUTDIR [torch_difftest.py options, e.g. --ops add,matmul]
#
# KILN_BUILD_DIR names the build (default: build); PYTHON the interpreter with torch,
# safetensors and numpy (default: python3).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 cpu|cuda OUTDIR [torch_difftest.py options]" >&2
  exit 2
fi
device=$1 out=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
build=${KILN_BUILD_DIR:-$here/../../build}
ops=()
for arg in "$@"; do [[ $arg == --ops=* ]] && ops=(--ops "${arg#--ops=}"); done
"$build/tools/kiln_difftest" --device "$device" --out "$out" "${ops[@]}"
"${PYTHON:-python3}" "$here/torch_difftest.py" "$out" --device "$device" "$@"
