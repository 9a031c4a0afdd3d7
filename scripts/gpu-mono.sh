#!/usr/bin/env bash
# One device call for a mono change: correctness, then speed, in one run.
#   1. GpuMono.* and GpuLayerRange.* of BIN (mono's logits bitwise native's, watchdog, creation);
#   2. `m3mono bench` of BIN at one TP-4 rank of MiniMax-M3 (60 layers, CONTEXTS, decode batches
#      BATCHES), paths PATHS (default native,mono; variants as mono:key=value/..., see
#      `m3mono bench --help`) side by side in the same run, the mono launch traced task by task;
#   3. with OLD_BIN: its bench of native + mono at batch 1, so a change of the kernel itself is seen
#      next to the run-to-run spread of native.
# TEST_OPTIONS="o1 o2 ..." (mono options as key=value/...): step 1 also runs GpuMono.* under each
# (M3_TEST_MONO_OPTIONS), so an option's bits are checked in the call that times it (PATHS
# mono:o1,...).
#   scripts/gpu-mono.sh BIN [OLD_BIN] [BATCHES (default 1,4)] [CONTEXTS (default 8K)]
# Each BIN holds m3mono (and m3_tests_gpu, lib/ for shared libraries the machine lacks). Logs go under
# $OUT (default /tmp/gpu-mono); a table prints last. Exit 1 when a test fails.
set -u
cd "$(dirname "$0")/.."
BIN=${1:?usage: gpu-mono.sh BIN [OLD_BIN] [BATCHES] [CONTEXTS]}
OLD=${2:-}
BATCHES=${3:-1,4}
CONTEXTS=${4:-8K}
OUT=${OUT:-/tmp/gpu-mono}
mkdir -p "$OUT"
export M3_TEST_DATA="$PWD/tests/data"
libs() { [ -d "$1/lib" ] && echo "$(cd "$1/lib" && pwd):${LD_LIBRARY_PATH:-}" || echo "${LD_LIBRARY_PATH:-}"; }
table="$OUT/table.txt"
: >"$table"
rc=0
if [ -x "$BIN/m3_tests_gpu" ]; then
  LD_LIBRARY_PATH=$(libs "$BIN") timeout 400 "$BIN/m3_tests_gpu" --gtest_filter='GpuMono.*:GpuLayerRange.*' \
    >"$OUT/tests.log" 2>&1 || rc=1
  echo "tests: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/tests.log" | tr '\n' ' ')" >>"$table"
  grep -E '^\[  FAILED  \] Gpu' "$OUT/tests.log" >>"$table"
  for o in ${TEST_OPTIONS:-}; do
    log="$OUT/tests-$(tr -c 'A-Za-z0-9_=\n-' '_' <<<"$o").log"
    LD_LIBRARY_PATH=$(libs "$BIN") M3_TEST_MONO_OPTIONS="$o" timeout 300 "$BIN/m3_tests_gpu" \
      --gtest_filter='GpuMono.*' >"$log" 2>&1 || rc=1
    echo "tests under $o: $(grep -E '^\[  (PASSED|FAILED)  \]' "$log" | tr '\n' ' ')" >>"$table"
    grep -E '^\[  FAILED  \] Gpu' "$log" >>"$table"
  done
fi
LD_LIBRARY_PATH=$(libs "$BIN") timeout 500 "$BIN/m3mono" bench --tp-shard 4 --layers 60 --context "$CONTEXTS" \
  --batch "$BATCHES" --paths "${PATHS:-native,mono}" --trace "$OUT/trace.csv" --commit new \
  --json "$OUT/bench-new.json" >"$OUT/bench-new.txt" 2>"$OUT/bench-new.log" || echo "bench new failed" >>"$table"
grep -E "^decode" "$OUT/bench-new.txt" | sed "s/^/new: /" >>"$table"
if [ -n "$OLD" ]; then
  LD_LIBRARY_PATH=$(libs "$OLD") timeout 300 "$OLD/m3mono" bench --tp-shard 4 --layers 60 --context 8K --batch 1 \
    --paths native,mono --commit old >"$OUT/bench-old.txt" 2>"$OUT/bench-old.log" || echo "bench old failed" >>"$table"
  grep -E "^decode" "$OUT/bench-old.txt" | sed "s/^/old: /" >>"$table"
fi
cat "$table"
exit $rc
