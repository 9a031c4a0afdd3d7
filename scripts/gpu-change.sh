#!/usr/bin/env bash
# One device call for a kernel change that must keep the bits: a new build against the build
# before it, and the change's own switch, in one run (each step under its own time limit, so a
# slow step cannot cost the later ones' results):
#   1. GpuBitsDump of OLD (twice: reproducible) and of NEW at every value of VAR: every logit
#      bitwise OLD's (where not, scripts/bits-diff.py names the first steps that differ);
#   2. scripts/gpu-check.sh NEW (every GPU test, conformance, generate);
#   3. scripts/ab-bench.sh: OLD (as base) and NEW interleaved, LAYERS (default 60) at BATCH
#      (default 1,4), paths native, mono and EXTRA (a mono variant, e.g. mono:fp8_whole=1; optional);
#   4. NEW's decode step at each value of VAR (scripts/gpu-sweep.sh's step part: native and mono),
#      SW_ROUNDS rounds (default 2).
# A short call: CHECK_FILTER=<gtest filter> runs only those GPU tests in step 2, SW_ROUNDS=0.
#   scripts/gpu-change.sh NEW OLD VAR "V1 V2 ..." [EXTRA]
# VAR "-": each value is itself a comma-separated list of assignments, for changes with several
# switches: scripts/gpu-change.sh NEW OLD - "A=1,B=1 A=0,B=1 A=1,B=0"
# NEW: a full pack (scripts/gpubin.sh pack .gpubin/NEW), OLD: a pack or its bin.tar.xz alone (run
# with NEW's lib/). Logs under $OUT (default /tmp/gpu-change, tarred into logs.tgz); a summary last.
set -u
cd "$(dirname "$0")/.."
NEW=${1:?usage: gpu-change.sh NEW OLD VAR "V1 V2 ..." [EXTRA]}
OLD=${2:?usage}
VAR=${3:?usage}
VALS=(${4:?usage})
EXTRA=${5:-}
OUT=${OUT:-/tmp/gpu-change}
mkdir -p "$OUT/logs"
export M3_TEST_DATA="$PWD/tests/data"
for b in "$NEW" "$OLD"; do [ -x ".gpubin/$b/m3mono" ] || scripts/gpubin.sh unpack ".gpubin/$b" >/dev/null; done
L="$PWD/.gpubin/$NEW/lib"
export LD_LIBRARY_PATH="$L:${LD_LIBRARY_PATH:-}"
sum="$OUT/summary.txt"
: >"$sum"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$sum" 2>&1
envs() {  # the assignments of value $1 (one per line)
  if [ "$VAR" = - ]; then tr ',' '\n' <<<"$1"; else echo "$VAR=$1"; fi
}
tag() { tr -c 'A-Za-z0-9_=\n-' '_' <<<"$1"; }  # a value as a file name part
STEP_LOGS="$OUT/logs" STEP_SUMMARY="$sum"
source scripts/device-step.sh
# 1. bits
step bits-old 60 env M3_BITS_DUMP="$OUT/bits-old.bin" ".gpubin/$OLD/m3_tests_gpu" --gtest_filter='GpuBitsDump.*'
# the old build against itself: the dump must be reproducible for the comparisons to mean anything
step bits-old2 60 env M3_BITS_DUMP="$OUT/bits-old2.bin" ".gpubin/$OLD/m3_tests_gpu" --gtest_filter='GpuBitsDump.*'
if cmp -s "$OUT/bits-old.bin" "$OUT/bits-old2.bin"; then echo "bits: $OLD reproduces its own dump" >>"$sum"
else echo "bits: $OLD does NOT reproduce its own dump" >>"$sum"; fi
for v in "${VALS[@]}"; do
  mapfile -t E < <(envs "$v")
  t=$(tag "$v")
  step "bits-$t" 60 env "${E[@]}" M3_BITS_DUMP="$OUT/bits-$t.bin" ".gpubin/$NEW/m3_tests_gpu" --gtest_filter='GpuBitsDump.*'
  if cmp -s "$OUT/bits-old.bin" "$OUT/bits-$t.bin"; then echo "bits ${E[*]}: identical to $OLD" >>"$sum"
  else
    echo "bits ${E[*]}: DIFFER from $OLD" >>"$sum"
    python3 scripts/bits-diff.py "$OUT/bits-old.bin" "$OUT/bits-$t.bin" 2>&1 | sed 's/^/  /' >>"$sum"
  fi
done
rm -f "$OUT"/bits-*.bin "$OUT"/bits-*.bin.idx
# 2. every GPU test (CHECK_FILTER: only the GPU tests it names, a gtest filter, for a short call)
if [ -n "${CHECK_FILTER:-}" ]; then
  mkdir -p "$OUT/check"
  step check "${CHECK_S:-290}" ".gpubin/$NEW/m3_tests_gpu" --gtest_filter="$CHECK_FILTER" --gtest_color=no
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$OUT/logs/check.txt" >"$OUT/check/table.txt"
else
  step check "${CHECK_S:-290}" env OUT="$OUT/check" GPU_CHECK_TIMEOUT=240 scripts/gpu-check.sh ".gpubin/$NEW"
fi
# 3. old against new, interleaved
rm -rf .gpubin/base && cp -r ".gpubin/$OLD" .gpubin/base
step ab "${AB_S:-200}" env OUT="$OUT/ab" LAYERS="${LAYERS:-60}" BATCH="${BATCH:-1,4}" scripts/ab-bench.sh "$NEW" $EXTRA
# 4. the switch's values, interleaved twice
for r in $(seq 1 "${SW_ROUNDS:-2}"); do
  for v in "${VALS[@]}"; do
    mapfile -t E < <(envs "$v")
    t=$(tag "$v")
    step "sw-$t-$r" 100 env "${E[@]}" ".gpubin/$NEW/m3mono" bench --tp-shard 4 --layers "${LAYERS:-60}" --context 8K \
      --batch "${BATCH:-1,4}" --paths native,mono
    grep -E "^decode" "$OUT/logs/sw-$t-$r.txt" | grep -v stream | awk -v r="$r" -v v="${E[*]}" '{print "round", r, v, $2, $4, $5}' >>"$OUT/sw.txt"
  done
done
echo "== summary"; cat "$sum"
echo "== gpu-check"; tail -n 30 "$OUT/check/table.txt" 2>/dev/null
echo "== ab (run binary batch path median_us)"; grep -E "^[12] " "$OUT/logs/ab.txt"
echo "== the switches"; cat "$OUT/sw.txt" 2>/dev/null
(cd "$OUT" && tar czf logs.tgz logs check ab 2>/dev/null && rm -rf logs)
