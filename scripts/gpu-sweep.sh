#!/usr/bin/env bash
# One device call for a kernel experiment behind an environment switch with several values (e.g.
# M3_MOE_WALK): the same binary at each value, side by side (scripts/gpu-ab.sh does two values with
# a trace and mono).
#   scripts/gpu-sweep.sh BIN VAR "V1 V2 ..."        (V1: the reference value, usually the default)
#   1. GpuBitsDump at every value: the logits of a fixed scenario must be bitwise V1's;
#   2. GPU tests (TESTS, default GpuMoeMma.*) at every value but V1;
#   3. `m3mono bench --kernels` (tp4, M = KMS, default 1) at every value: its ROWS lines (default moe);
#   4. `m3mono bench --tp-shard 4 --layers LAYERS (30) --context 8K --batch BATCHES (1) --paths PATHS
#      (native)` at every value, interleaved ROUNDS (2) times: medians in one run.
# BIN as scripts/gpubin.sh leaves it (unpacked here first when it holds *.xz; lib/ used when there).
# Logs under $OUT (default /tmp/gpu-sweep, tarred into logs.tgz); a table prints last. Exit 1 when
# a test or the bits fail.
set -u
cd "$(dirname "$0")/.."
BIN=${1:?usage: gpu-sweep.sh BIN VAR "V1 V2 ..."}
VAR=${2:?usage: gpu-sweep.sh BIN VAR "V1 V2 ..."}
VALS=(${3:?usage: gpu-sweep.sh BIN VAR "V1 V2 ..."})
OUT=${OUT:-/tmp/gpu-sweep}
mkdir -p "$OUT/logs"
ls "$BIN"/*.xz >/dev/null 2>&1 && scripts/gpubin.sh unpack "$BIN"
export M3_TEST_DATA="$PWD/tests/data"
[ -d "$BIN/lib" ] && export LD_LIBRARY_PATH="$(cd "$BIN/lib" && pwd):${LD_LIBRARY_PATH:-}"
table="$OUT/table.txt"
: >"$table"
rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$table" 2>&1
ref=${VALS[0]}
for v in "${VALS[@]}"; do
  env "$VAR=$v" M3_BITS_DUMP="$OUT/bits-$v.bin" timeout 120 "$BIN/m3_tests_gpu" --gtest_filter='GpuBitsDump.*' \
    --gtest_color=no >"$OUT/logs/bits-$v.log" 2>&1 || rc=1
  if cmp -s "$OUT/bits-$ref.bin" "$OUT/bits-$v.bin"; then echo "bits $VAR=$v: identical to $ref" >>"$table"
  else echo "bits $VAR=$v: DIFFER from $ref" >>"$table"; rc=1; fi
done
rm -f "$OUT"/bits-*.bin
for v in "${VALS[@]:1}"; do
  env "$VAR=$v" timeout 200 "$BIN/m3_tests_gpu" --gtest_filter="${TESTS:-GpuMoeMma.*}" --gtest_color=no \
    >"$OUT/logs/tests-$v.log" 2>&1 || rc=1
  echo "tests $VAR=$v: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/logs/tests-$v.log" | tr '\n' ' ')" >>"$table"
done
for v in "${VALS[@]}"; do
  env "$VAR=$v" timeout 120 "$BIN/m3mono" bench --kernels --no-steps --kernel-ms "${KMS:-1}" --kernel-tps 4 \
    --no-cublas >"$OUT/logs/kernels-$v.txt" 2>&1 || echo "kernels $VAR=$v failed" >>"$table"
  grep -E "^(${ROWS:-moe})" "$OUT/logs/kernels-$v.txt" | sed "s/^/$VAR=$v: /" >>"$table"
done
for r in $(seq "${ROUNDS:-2}"); do
  for v in "${VALS[@]}"; do
    env "$VAR=$v" timeout 200 "$BIN/m3mono" bench --tp-shard 4 --layers "${LAYERS:-30}" --context 8K \
      --batch "${BATCHES:-1}" --paths "${PATHS:-native}" >"$OUT/logs/bench-$v-$r.txt" 2>&1 ||
      echo "bench $VAR=$v failed" >>"$table"
    grep -E "^decode" "$OUT/logs/bench-$v-$r.txt" | sed "s/^/round $r $VAR=$v: /" >>"$table"
  done
done
(cd "$OUT" && tar czf logs.tgz logs && rm -rf logs)
cat "$table"
exit $rc
