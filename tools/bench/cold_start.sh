#!/usr/bin/env bash
# Cold against warm starts of mnist-train, each run a fresh process: cold on an empty kernel
# cache, warm (twice) on the cache the cold run filled. NVRTC's own cache is off in every run
# (CUDA_CACHE_DISABLE=1): since CUDA 12.9 NVRTC keeps what it compiled in the driver's compute
# cache (~/.nv/ComputeCache), so a second "cold" run of the same kernels compiles nothing and
# is 5-8x faster at it than a first.
#
#   tools/bench/cold_start.sh MNIST_TRAIN [ROUNDS] [CONFIG ...]
# CONFIG: mnist-train arguments as one word, e.g. "--model cnn --precision bf16"; the default is
# every model and precision and the speedrun. Prints a line per run and configuration.
set -euo pipefail
train=${1:?usage: cold_start.sh MNIST_TRAIN [ROUNDS] [CONFIG ...]}
rounds=${2:-1}
shift $(($# < 2 ? $# : 2))
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=("--model mlp" "--model mlp --precision tf32" "--model mlp --precision bf16"
  "--model cnn" "--model cnn --precision tf32" "--model cnn --precision bf16" "--recipe speedrun")
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
export CUDA_CACHE_DISABLE=1

# Whole-process milliseconds, then what the summary says of 99%, waits and compiles.
one() {
  local out start
  out=$(mktemp)
  start=$(date +%s%N)
  # shellcheck disable=SC2086  # a configuration is several arguments
  KILN_CACHE_DIR=$cache "$train" $1 >"$out" 2>&1 || { echo "failed: $train $1" >&2; tail -5 "$out" >&2; exit 1; }
  echo "$((($(date +%s%N) - start) / 1000000)) ms [$(grep -oE '99% at [0-9.]+ s since' "$out" | head -1)$(grep -oE 'waited [0-9]+ ms' "$out" | head -1); $(grep -oE '[0-9]+ compiled \([0-9]+ ms' "$out" | head -1) of NVRTC$(grep -oE 'quick tier: [0-9]+ of them quick builds that ran first, [0-9]+' "$out" | head -1 | sed -E 's/quick tier: ([0-9]+).*, ([0-9]+)$/; \1 quick, \2 replaced/')]"
  rm -f "$out"
}

for ((r = 1; r <= rounds; r++)); do
  for c in "${configs[@]}"; do
    rm -rf "${cache:?}"/*
    cold=$(one "$c")
    warm1=$(one "$c")
    warm2=$(one "$c")
    ratio=$(awk -v c="${cold%% *}" -v a="${warm1%% *}" -v b="${warm2%% *}" 'BEGIN { printf "%.2f", 2 * c / (a + b) }')
    echo "round $r, $c: cold $cold | warm $warm1 | warm $warm2 | cold/warm ${ratio}x"
  done
done
