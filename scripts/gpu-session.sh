#!/usr/bin/env bash
# Everything the GPU machine has to confirm, in one call (fits one device run of ~10 minutes):
#   1. scripts/gpu-check.sh: every GPU test, conformance and generate on both devices (one table);
#   2. scripts/gpu-soak.sh: serve --device cuda + smoke 8,5,4,2,1 + a SOAK-second soak;
#   3. scripts/bench-native.sh: the MiniMax-M3-scale benchmark (one TP-4 rank, 60 layers, 8K).
# From the repository root of the GPU machine:
#   scripts/gpu-session.sh [BIN_DIR] [SOAK_SECONDS]      (defaults: build/release, 240)
# BIN_DIR holds m3mono and m3_tests_gpu (and lib/ for shared libraries the machine lacks). Logs go
# under $OUT (default /tmp/gpu-session): check/, soak/, bench/; a summary prints last.
set -u
cd "$(dirname "$0")/.."
BIN=${1:-build/release}
SOAK=${2:-240}
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
sum="$OUT/summary.txt"
: >"$sum"
STEP_LOGS="$OUT" STEP_SUMMARY="$sum"
source scripts/device-step.sh
step check 300 env OUT="$OUT/check" GPU_CHECK_TIMEOUT=240 scripts/gpu-check.sh "$BIN"
step soak $((SOAK + 120)) env OUT="$OUT/soak" scripts/gpu-soak.sh "$BIN" "$SOAK"
step bench 240 env M3MONO="$BIN/m3mono" scripts/bench-native.sh "$OUT/bench" --eager-reps 1
echo "== summary"; cat "$sum"
echo "== gpu-check"; tail -n 40 "$OUT/check/table.txt" 2>/dev/null
echo "== soak"; grep -E "level|ref |c=|soak|cache blocks|PASS|FAIL" "$OUT/soak.txt" | head -14
echo "== bench"; grep -E "^(decode|prefill)" "$OUT/bench/bench.txt" 2>/dev/null
grep -q "rc=0 " "$sum" && ! grep -vq "rc=0 " "$sum"
