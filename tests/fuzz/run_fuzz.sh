#!/usr/bin/env bash
# Builds the fuzz targets with clang (libFuzzer, ASan, UBSan, the libraries instrumented too)
# and runs each for about SECONDS of a core (default 60), side by side, from a copy of its seed
# corpus. Any crash, leak, timeout or sanitizer report makes the script exit non-zero; the
# inputs are kept and listed.
#   tests/fuzz/run_fuzz.sh [SECONDS]     env: KILN_FUZZ_BUILD (build dir), JOBS (ninja -j)
set -euo pipefail

seconds=${1:-60}
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${KILN_FUZZ_BUILD:-$root/build-fuzz}
targets=(idx safetensors disk_cache_entry)

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# A build dir configured already (CI's sanitizer build) is reused as it is.
[ -f "$build/CMakeCache.txt" ] || CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_FUZZ=ON -DKILN_SANITIZE=address,undefined -DKILN_BUILD_TOOLS=OFF \
  -DKILN_BUILD_EXAMPLES=OFF "${launcher[@]}" >/dev/null
ninja -C "$build" -j"${JOBS:-2}" "${targets[@]/#/fuzz_}"

# UBSan reports only print by default; halting turns them into crashes libFuzzer records.
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-fuzz.XXXXXX")
# The targets run side by side, one core each where there are enough: on fewer cores than
# targets each runs longer, so that each still gets about SECONDS of a core.
cores=$(nproc 2>/dev/null || echo 1)
parallel=$(( cores < ${#targets[@]} ? cores : ${#targets[@]} ))
wall=$(( (seconds * ${#targets[@]} + parallel - 1) / parallel ))
mkdir -p "$work/artifacts"
pids=()
for t in "${targets[@]}"; do
  cp -r "$root/tests/fuzz/corpus/$t" "$work/$t"
  echo "== fuzz_$t for ${wall}s (${#targets[@]} targets on $cores cores)"
  "$build/tests/fuzz/fuzz_$t" -max_total_time="$wall" -timeout=20 -rss_limit_mb=2048 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$work/artifacts/$t-" "$work/$t" \
    >"$work/$t.log" 2>&1 &
  pids+=($!)
done
failed=()
for i in "${!targets[@]}"; do
  t=${targets[$i]}
  if ! wait "${pids[$i]}"; then
    failed+=("$t")
    tail -n 60 "$work/$t.log"
  fi
  grep -E "^(stat::number_of_executed_units|Done [0-9]+ runs)" "$work/$t.log" | sed "s/^/fuzz_$t: /" || true
done

if ((${#failed[@]})); then
  echo "FAILED: ${failed[*]}; inputs in $work/artifacts:" >&2
  ls -l "$work/artifacts" >&2
  exit 1
fi
rm -rf "$work"
echo "all fuzz targets ran without a finding (${wall}s each, side by side)"
