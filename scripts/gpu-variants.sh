#!/usr/bin/env bash
# One device call for mono options before one becomes a default: each variant's bits, then all of
# them timed side by side in one run.
#   scripts/gpu-variants.sh BIN "opt1 opt2 ..."      (e.g. "fp8_whole=2 fp8_whole=3/early=0")
#   1. for each variant: GpuMono.* (FILTER) with M3_TEST_MONO_OPTIONS=variant (mono's logits
#      bitwise native's under it), TEST_S seconds each (default 150);
#   2. `m3mono bench` (one TP-4 rank, LAYERS (60) layers, 8K, batches BATCH (1,4)), paths native,
#      mono and mono:variant for each (and EXTRA_PATHS, e.g. mono:fp8_whole=1: timed, not tested),
#      ROUNDS (2) runs: ratios from one run each;
#   3. TRACE_LAYERS (optional, e.g. 57: the sparse layers alone, so native's spans hold no dense
#      layer): a traced bench at batch 1 of native, mono and the variants over those last layers.
# BIN as scripts/gpubin.sh leaves it (unpacked here when it holds *.xz). Logs under $OUT (default
# /tmp/gpu-variants; traces tarred into traces.tgz); a table prints last. Exit 1 when a test fails.
set -u
cd "$(dirname "$0")/.."
BIN=${1:?usage: gpu-variants.sh BIN "opt1 opt2 ..."}
VARS=(${2:?usage: gpu-variants.sh BIN "opt1 opt2 ..."})
FILTER=${FILTER:-GpuMono.*}
OUT=${OUT:-/tmp/gpu-variants}
mkdir -p "$OUT/csv"
ls "$BIN"/*.xz >/dev/null 2>&1 && [ ! -x "$BIN/m3mono" ] && scripts/gpubin.sh unpack "$BIN" >/dev/null
export M3_TEST_DATA="$PWD/tests/data"
[ -d "$BIN/lib" ] && export LD_LIBRARY_PATH="$(cd "$BIN/lib" && pwd):${LD_LIBRARY_PATH:-}"
tag() { tr -c 'A-Za-z0-9_=\n-' '_' <<<"$1"; }
table="$OUT/table.txt"
: >"$table"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$table" 2>&1
rc=0
for v in "${VARS[@]}"; do
  t0=$(date +%s)
  log="$OUT/tests-$(tag "$v").log"
  timeout "${TEST_S:-150}" env M3_TEST_MONO_OPTIONS="$v" "$BIN/m3_tests_gpu" --gtest_filter="$FILTER" \
    --gtest_color=no >"$log" 2>&1 || rc=1
  echo "tests under $v: $(grep -E '^\[  (PASSED|FAILED)  \]' "$log" | tr '\n' ' ') ($(( $(date +%s) - t0 )) s)" >>"$table"
  grep -E '^\[  FAILED  \] Gpu' "$log" >>"$table"
done
paths=native,mono
for v in "${VARS[@]}"; do paths+=",mono:$v"; done
[ -n "${EXTRA_PATHS:-}" ] && paths+=",$EXTRA_PATHS"
for r in $(seq 1 "${ROUNDS:-2}"); do
  timeout "${BENCH_S:-200}" "$BIN/m3mono" bench --tp-shard 4 --layers "${LAYERS:-60}" --context 8K \
    --batch "${BATCH:-1,4}" --paths "$paths" >"$OUT/bench-$r.txt" 2>&1 || echo "bench round $r failed (exit $?)" >>"$table"
  grep -E "^decode" "$OUT/bench-$r.txt" | grep -v stream | sed "s/^/round $r: /" >>"$table"
done
if [ -n "${TRACE_LAYERS:-}" ]; then
  timeout "${TRACE_S:-150}" "$BIN/m3mono" bench --tp-shard 4 --layers "$TRACE_LAYERS" --context 8K --batch 1 \
    --paths "$paths" --trace "$OUT/csv/t" >"$OUT/trace.txt" 2>&1 || echo "traced bench failed (exit $?)" >>"$table"
  (cd "$OUT" && tar czf traces.tgz csv && rm -rf csv)
fi
cat "$table"
exit $rc
