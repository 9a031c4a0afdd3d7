#!/usr/bin/env bash
# Device call for EAGLE3 on the GPU (issue 18), from the repository root on the GPU machine:
#   scripts/gpu-eagle3.sh BIN_DIR      (BIN_DIR: a scripts/gpubin.sh pack, unpacked)
# Runs GpuEagle3.* (aux rows vs the reference, bitwise alone / batched / replayed / on mono in
# parts; greedy EAGLE3 generation equal to plain decoding natively and with mono), the backend,
# layer-range and mono tests the aux copies touch (TESTS overrides the filter), then the decode bench
# without and with --aux-layers 2,30,57 (what the MiniMax-M3 draft reads) on one TP-4 rank of 60
# layers at 8K, native and mono. Full logs under $OUT; a table last.
set -u
cd "$(dirname "$0")/.."
BIN=${1:?usage: scripts/gpu-eagle3.sh BIN_DIR}
OUT=${OUT:-/tmp/gpu-eagle3}
mkdir -p "$OUT"
export M3_TEST_DATA="$PWD/tests/data"
[ -d "$BIN/lib" ] && export LD_LIBRARY_PATH="$(cd "$BIN/lib" && pwd):${LD_LIBRARY_PATH:-}"
TESTS=${TESTS:-'GpuEagle3.*:GpuCudaBackend.*:GpuLayerRange.*:GpuMono.*:GpuModel.TinyM3a*'}
rows=()
timeout "${GPU_TEST_TIMEOUT:-330}" "$BIN/m3_tests_gpu" --gtest_filter="$TESTS" >"$OUT/tests.log" 2>&1
rc=$?
rows+=("tests ($TESTS) | exit $rc | $(grep -c '^\[       OK \]' "$OUT/tests.log") passed, $(grep -c '^\[  FAILED  \] [A-Za-z]' "$OUT/tests.log") failed")
while read -r l; do rows+=("  $l"); done < <(grep -E '^\[  FAILED  \] [A-Za-z]|\[eagle3' "$OUT/tests.log" | sed 's/^ *//')
for a in "" "--aux-layers 2,30,57"; do
  log="$OUT/bench${a:+.aux}.log"
  "$BIN/m3mono" bench --tp-shard 4 --layers 60 --context 8K --batch 1,2,4 --paths native,mono $a >"$log" 2>&1 ||
    rows+=("bench ${a:-plain} | FAILED | $(tail -1 "$log")")
  while read -r l; do rows+=("bench ${a:-plain} | $l"); done < <(grep -E "^decode" "$log" | grep -v stream | awk '{print $2, $4, $5 " us"}')
  rows+=("bench ${a:-plain} | mono set-up step vs native | $(grep -o '[0-9]* logits differ' "$log" | sort | uniq -c | tr '\n' ' ')")
done
printf '%s\n' "${rows[@]}"
exit $rc
