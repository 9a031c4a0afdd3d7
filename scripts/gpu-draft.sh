#!/usr/bin/env bash
# Device call for the GPU EAGLE3 draft network (issue 18), from the repository root on the GPU machine:
#   scripts/gpu-draft.sh NEW_DIR [BASE_DIR]     (scripts/gpubin.sh packs, unpacked here)
# Runs GpuEagle3.* on NEW (TESTS overrides the filter), then `m3mono bench --no-steps --eagle3-draft`
# (one TP-4 rank's shape, random weights) on BASE and NEW, alternated twice, so their draft times
# come from one machine. Full logs under $OUT; a table last.
set -u
cd "$(dirname "$0")/.."
NEW=${1:?usage: scripts/gpu-draft.sh NEW_DIR [BASE_DIR]}
BASE=${2:-}
OUT=${OUT:-/tmp/gpu-draft}
mkdir -p "$OUT"
export M3_TEST_DATA="$PWD/tests/data"
for d in "$NEW" $BASE; do
  ls "$d"/*.xz >/dev/null 2>&1 && scripts/gpubin.sh unpack "$d" >/dev/null
done
run() {  # DIR: its libraries first (NEW's when it has none)
  local d=$1 lib=$1/lib; shift
  [ -d "$lib" ] || lib=$NEW/lib
  LD_LIBRARY_PATH="$(cd "$lib" && pwd):${LD_LIBRARY_PATH:-}" "$@"
}
rows=()
TESTS=${TESTS:-'GpuEagle3.*'}
run "$NEW" timeout "${GPU_TEST_TIMEOUT:-330}" "$NEW/m3_tests_gpu" --gtest_filter="$TESTS" >"$OUT/tests.log" 2>&1
rc=$?
rows+=("tests ($TESTS) | exit $rc | $(grep -c '^\[       OK \]' "$OUT/tests.log") passed, $(grep -c '^\[  FAILED  \] [A-Za-z]' "$OUT/tests.log") failed")
while read -r l; do rows+=("  $l"); done < <(grep -E '^\[  FAILED  \] [A-Za-z]|\[eagle3' "$OUT/tests.log" | sed 's/^ *//')
for rep in 1 2; do
  for d in $BASE "$NEW"; do
    log="$OUT/bench.$(basename "$d").$rep.log"
    run "$d" timeout 300 "$d/m3mono" bench --no-steps --eagle3-draft --tp-shard 4 --layers 60 >"$log" 2>&1 ||
      rows+=("bench $(basename "$d") run $rep | FAILED | $(tail -1 "$log")")
    while read -r l; do rows+=("bench $(basename "$d") run $rep | $l"); done < <(grep -o 'eagle3 draft on the GPU.*' "$log" | sed 's/^eagle3 draft on the GPU (random weights[^)]*after a \([0-9]*\)-token history)/history \1/' | sort -u)
  done
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$OUT/gpu.txt" 2>&1
rows+=("gpu | $(cat "$OUT/gpu.txt")")
printf '%s\n' "${rows[@]}"
exit $rc
