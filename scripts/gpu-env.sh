#!/usr/bin/env bash
# One device call for an environment switch before it becomes a default (as M3_PDL=1 did, 2026-12-07):
#   scripts/gpu-env.sh BIN "A=1[,B=2,...]" [FILTER]
#   1. the GPU tests FILTER (a gtest filter; default the backend, mono, whole-model, TP, layer-range
#      and device-layer tests and the bench harness's native path) with the assignments set;
#   2. `m3mono bench` (one TP-4 rank, LAYERS (60) layers, 8K, batches BATCH (1,4), native and mono)
#      without and with them, interleaved ROUNDS (2) times: medians in one run.
# BIN as scripts/gpubin.sh leaves it (unpacked here when it holds *.xz). Logs under $OUT (default
# /tmp/gpu-env); a table prints last. Exit 1 when a test fails.
set -u
cd "$(dirname "$0")/.."
BIN=${1:?usage: gpu-env.sh BIN "A=1,B=2" [FILTER]}
SET=${2:?usage: gpu-env.sh BIN "A=1,B=2" [FILTER]}
FILTER=${3:-GpuCudaBackend.*:GpuMono.*:GpuModel.*:GpuTensorParallel.*:GpuLayerRange.*:GpuDeviceLayers.*:BenchHarness.NativePath*}
OUT=${OUT:-/tmp/gpu-env}
mkdir -p "$OUT"
ls "$BIN"/*.xz >/dev/null 2>&1 && [ ! -x "$BIN/m3mono" ] && scripts/gpubin.sh unpack "$BIN" >/dev/null
export M3_TEST_DATA="$PWD/tests/data"
[ -d "$BIN/lib" ] && export LD_LIBRARY_PATH="$(cd "$BIN/lib" && pwd):${LD_LIBRARY_PATH:-}"
mapfile -t E < <(tr ',' '\n' <<<"$SET")
table="$OUT/table.txt"
: >"$table"
rc=0
t0=$(date +%s)
timeout "${TEST_S:-400}" env "${E[@]}" "$BIN/m3_tests_gpu" --gtest_filter="$FILTER" --gtest_color=no >"$OUT/tests.log" 2>&1 || rc=1
echo "tests with ${E[*]}: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/tests.log" | tr '\n' ' ') ($(( $(date +%s) - t0 )) s)" >>"$table"
grep -E '^\[  FAILED  \] Gpu' "$OUT/tests.log" >>"$table"
for r in $(seq 1 "${ROUNDS:-2}"); do
  for s in off on; do
    if [ $s = on ]; then set_=("${E[@]}"); else set_=(M3_GPU_ENV_NONE=1); fi
    timeout 200 env "${set_[@]}" "$BIN/m3mono" bench --tp-shard 4 --layers "${LAYERS:-60}" --context 8K \
      --batch "${BATCH:-1,4}" --paths native,mono >"$OUT/bench-$s-$r.txt" 2>&1 || echo "bench $s $r failed" >>"$table"
    grep -E "^decode" "$OUT/bench-$s-$r.txt" | grep -v stream | sed "s/^/round $r $s: /" >>"$table"
  done
done
cat "$table"
exit $rc
