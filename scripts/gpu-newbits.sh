#!/usr/bin/env bash
# One device call for a kernel change that changes the bits on purpose (new numerics, tolerances
# unchanged): the tests that judge the change first, then its speed against the build before it,
# then every other GPU test, each step under its own time limit so a slow step cannot cost the
# earlier ones' results:
#   1. FIRST (a gtest filter, default the attention and mono-vs-native tests) of NEW;
#   2. scripts/ab-bench.sh: OLD (as base) and NEW interleaved, LAYERS (default 60) at BATCH
#      (default 1,4), native and mono;
#   3. (PREFILL=1) one 8K prefill of OLD and NEW (60 layers of one TP-4 rank, native);
#   4. scripts/gpu-check.sh NEW (every GPU test, conformance, generate), CHECK_S seconds (default 300).
#   scripts/gpu-newbits.sh NEW OLD
# NEW: a full pack (scripts/gpubin.sh pack .gpubin/NEW); OLD: a pack or m3mono.xz alone (run with
# NEW's libraries). Logs under $OUT (default /tmp/gpu-newbits, tarred into logs.tgz); a summary last.
set -u
cd "$(dirname "$0")/.."
NEW=${1:?usage: gpu-newbits.sh NEW OLD}
OLD=${2:?usage: gpu-newbits.sh NEW OLD}
OUT=${OUT:-/tmp/gpu-newbits}
FIRST=${FIRST:-GpuAttention*:GpuMono.*Bitwise*}
mkdir -p "$OUT/logs"
export M3_TEST_DATA="$PWD/tests/data"
[ -x ".gpubin/$NEW/m3mono" ] || scripts/gpubin.sh unpack ".gpubin/$NEW" >/dev/null
export LD_LIBRARY_PATH="$PWD/.gpubin/$NEW/lib:${LD_LIBRARY_PATH:-}"
sum="$OUT/summary.txt"
: >"$sum"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$sum" 2>&1
STEP_LOGS="$OUT/logs" STEP_SUMMARY="$sum"
source scripts/device-step.sh
step first "${FIRST_S:-150}" ".gpubin/$NEW/m3_tests_gpu" --gtest_filter="$FIRST" --gtest_color=no
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$OUT/logs/first.txt" >>"$sum"
rm -rf .gpubin/base && cp -r ".gpubin/$OLD" .gpubin/base
step ab "${AB_S:-200}" env OUT="$OUT/ab" LAYERS="${LAYERS:-60}" BATCH="${BATCH:-1,4}" scripts/ab-bench.sh "$NEW"
if [ "${PREFILL:-0}" = 1 ]; then
  for b in base "$NEW"; do
    step "prefill-$b" 90 ".gpubin/$b/m3mono" bench --tp-shard 4 --layers 60 --context 8K --batch 1 --prefill 8K \
      --paths native --steps 20 --warmup 5 --eager-reps 3 --tc-peak 989
    grep -E "^(decode|prefill)" "$OUT/logs/prefill-$b.txt" | sed "s/^/prefill run, $b: /" >>"$sum"
  done
fi
step check "${CHECK_S:-300}" env OUT="$OUT/check" GPU_CHECK_TIMEOUT=$(( ${CHECK_S:-300} - 40 )) \
  GPU_CHECK_SKIP="${FIRST}" scripts/gpu-check.sh ".gpubin/$NEW"
echo "== summary"; cat "$sum"
echo "== gpu-check"; tail -n 30 "$OUT/check/table.txt" 2>/dev/null
echo "== ab (run binary batch path median_us)"; grep -E "^[12] " "$OUT/logs/ab.txt"
(cd "$OUT" && tar czf logs.tgz logs check ab 2>/dev/null && rm -rf logs)
